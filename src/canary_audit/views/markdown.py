"""A frame as a GitHub Markdown table: how every page of the audit (the
tables' .md files, the claims table, the summary) shows numbers to people.
It sits with the views so that the verdicts, which write a claims table,
and the report read the one rule."""

from __future__ import annotations

import polars as pl


def format_cell(value: object, digits: int = 3) -> str:
    """One Markdown cell.  A float is rounded to `digits` decimals, except a
    non-zero one that rounding would show as 0 (a KS forget quality of 1e-15,
    a p-value), which keeps three significant digits in scientific notation:
    a reader must not see a zero that is not one."""
    if value is None:
        return ""
    if isinstance(value, float) and value != 0 and abs(value) < 0.5 * 10 ** -digits:
        return f"{value:.2e}"
    if isinstance(value, float):
        return str(round(value, digits))
    return str(value)


def to_markdown(frame: pl.DataFrame, digits: int = 3) -> str:
    """A GitHub Markdown table; floats as `format_cell` shows them."""
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(format_cell(v, digits) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows]) + "\n"

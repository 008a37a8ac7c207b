"""Parser conventions: how a generation is split into thinking trace and answer.

Paper A shows that the sign of the bypass gap can flip with the convention
alone (Llama-8B: -0.92 vs +0.92), so the split is a view parameter applied to
stored text, never something a probe pass decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

SPLITS = ("first", "last")
MISSING_CLOSE = ("answer", "trace", "unparseable")


@dataclass(frozen=True)
class ParserConvention:
    """`split`: cut at the first or the last closing tag.  `missing_close`:
    what a generation without a closing tag is — all answer, all trace, or
    unparseable (both channels null, counted and reported)."""

    split: str = "first"
    missing_close: str = "answer"

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"parser split `{self.split}`: must be one of {', '.join(SPLITS)}")
        if self.missing_close not in MISSING_CLOSE:
            raise ValueError(
                f"parser missing_close `{self.missing_close}`: must be one of {', '.join(MISSING_CLOSE)}"
            )

    @property
    def name(self) -> str:
        return f"{self.split}-close/missing-as-{self.missing_close}"


def split_trace_answer(
    generated: pl.Expr, think_open: str, think_close: str, convention: ParserConvention
) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(trace, answer, has_close) expressions over a column of generated text.

    The text is what the model wrote after the prompt; an opening tag at its
    start (the model opened its own trace) is not part of the trace.  The
    tags are literals, one pair per call (one model's records at a time).
    """
    text = generated.str.strip_prefix(think_open)
    has_close = text.str.contains(think_close, literal=True)
    if convention.split == "first":
        parts = text.str.splitn(think_close, 2)
        trace = parts.struct.field("field_0")
        answer = parts.struct.field("field_1")
    else:
        # The last tag: split the reversed string at the reversed tag, once.
        rparts = text.str.reverse().str.splitn(think_close[::-1], 2)
        answer = rparts.struct.field("field_0").str.reverse()
        trace = rparts.struct.field("field_1").str.reverse()
    if convention.missing_close == "answer":
        missing_trace, missing_answer = pl.lit(""), text
    elif convention.missing_close == "trace":
        missing_trace, missing_answer = text, pl.lit("")
    else:
        missing_trace = missing_answer = pl.lit(None, dtype=pl.Utf8)
    trace = pl.when(has_close).then(trace).otherwise(missing_trace)
    answer = pl.when(has_close).then(answer).otherwise(missing_answer)
    return trace, answer, has_close


def parse(frame: pl.DataFrame, convention: ParserConvention) -> pl.DataFrame:
    """Add `trace`, `answer`, `has_close` to decode records, per model's tags.

    A prefill arm's prompt already ends in the closing tag: everything it
    generated is answer, and its trace leak is zero by construction.
    """
    parts = []
    for (think_open, think_close), part in frame.group_by(["think_open", "think_close"], maintain_order=True):
        trace, answer, has_close = split_trace_answer(pl.col("generated"), think_open, think_close, convention)
        prefilled = pl.col("prompt").str.ends_with(think_close)
        parts.append(part.with_columns(
            trace=pl.when(prefilled).then(pl.lit("")).otherwise(trace),
            answer=pl.when(prefilled).then(pl.col("generated")).otherwise(answer),
            has_close=prefilled | has_close,
        ))
    if not parts:
        return frame.with_columns(
            trace=pl.lit(None, pl.Utf8), answer=pl.lit(None, pl.Utf8), has_close=pl.lit(None, pl.Boolean)
        )
    return pl.concat(parts)

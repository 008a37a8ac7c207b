"""The `borderline` margin: how far a CI end moves between two runs of one
config that differ only in float order.

Two machines of one kind give different numbers from the same config: CPU
float kernels sum in different orders, and training amplifies the
difference.  The same drift is reproduced on one machine by changing the
jobs' thread counts (threads 1 against 2: another reduction order).  For
each value measure of the registry, every CI end (and point) its table
holds for a row both runs share is compared; a measure's margin is the
largest move seen over the measured pairs.  A verdict whose CI end lies
within its measure's margin of its threshold is flagged `borderline`
(decision.py): another machine could read it the other way.

`benchmarks/margins.py` measures the pairs and writes margins.json beside
this module; the judge reads it (`load`).  A measure no pair measured has
no margin, and its verdicts say so instead of reading "not borderline".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from canary_audit.data.planted_controls import CONTROL
from canary_audit.verdicts.intervals import DIFFERENCE, RATE, interval
from canary_audit.verdicts.measures import MEASURES
from canary_audit.views.seeds import CELLS_TABLE
from canary_audit.views.table import read_table

MARGINS = Path(__file__).with_name("margins.json")
PAIRED = "paired:"  # the key prefix of a rate measure's margin as a paired difference (two rates move)
CONTROL_KEY = "control:"  # the key prefix of a planted control's own drift (controls.py reads it first)


def _table(tables: Path, name: str) -> pl.DataFrame | None:
    return read_table(tables / f"{name}.csv")


def drift(a: Path, b: Path) -> pl.DataFrame:
    """Per value measure: the CI ends compared and the largest and 95th
    percentile absolute move between the tables folders `a` and `b`, over
    the audit's variants (a planted control is built to sit far from its
    threshold, and is read by its own margin: controls.py)."""
    planted = [n for n, v in json.loads((a / "view_config.json").read_text()).get("variants", {}).items()
               if v.get("kind") == CONTROL]
    rows = []
    for m in MEASURES.values():
        if m.read is not None:
            continue
        left, right = _table(a, m.table), _table(b, m.table)
        if left is None or right is None or m.column not in left.columns:
            continue
        left, right = (f.filter(~pl.col("variant").is_in(planted)) for f in (left, right))
        columns = [c for c in (m.column, f"{m.column}_lo", f"{m.column}_hi") if c in left.columns]
        keys = [c for c in ("variant", *m.where) if c in left.columns and c in right.columns]
        for key, value in m.rows.items():
            left, right = (f.filter(pl.col(key).cast(pl.Utf8) == str(value)) for f in (left, right))
        joined = left.select(*keys, *columns).join(right.select(*keys, *columns), on=keys, suffix="_b")
        moves = joined.select(pl.concat_list([(pl.col(c) - pl.col(f"{c}_b")).abs() for c in columns]).alias("d")
                              ).explode("d").drop_nulls()["d"]
        if moves.len():
            rows.append({"measure": m.name, "scale": m.scale, "ends": moves.len(), "max": float(moves.max()),
                         "p95": float(moves.quantile(0.95))})
    rows += _cell_drift(a, b, planted) + _control_drift(a, b)
    return pl.DataFrame(rows, schema={"measure": pl.Utf8, "scale": pl.Utf8, "ends": pl.Int64, "max": pl.Float64,
                                      "p95": pl.Float64})


def _cell_intervals(tables: Path, column: str, scale: str, parents: dict[str, str]) -> dict[str, tuple]:
    """The judge's own intervals from a run's item cells (one seed's layout
    per variant): each variant's, and (key PAIRED + variant) its paired
    difference against its parent."""
    cells = _table(tables, CELLS_TABLE)
    if cells is None:
        return {}
    cells = cells.filter(pl.col("column") == column)
    by = {v: dict(zip(*part.select("group_id", "value").get_columns(), strict=True))
          for (v,), part in cells.group_by("variant")}
    out = {}
    for variant, values in by.items():
        items = sorted(values)
        out[variant] = interval(np.array([[values[i] for i in items]]), scale).at(0.95)
        parent = by.get(parents.get(variant) or "")
        if parent and set(parent) >= set(items):
            paired = np.array([[values[i] - parent[i] for i in items]])
            out[PAIRED + variant] = interval(paired, DIFFERENCE if scale == RATE else scale).at(0.95)
    return out


def _cell_drift(a: Path, b: Path, planted: list[str]) -> list[dict]:
    """The drift of the intervals the judge builds from item cells (paper
    A's rates), alone and paired against the parent: the margins a claim on
    them is flagged by."""
    variants = json.loads((a / "view_config.json").read_text()).get("variants", {})
    parents = {n: v.get("parent") for n, v in variants.items() if v.get("parent")}
    rows = []
    for m in MEASURES.values():
        if m.read is not None or not m.pooled:
            continue
        left, right = (_cell_intervals(t, m.pooled, m.scale, parents) for t in (a, b))
        for paired in (False, True):
            keys = [k for k in left if k in right and k.startswith(PAIRED) == paired
                    and k.removeprefix(PAIRED) not in planted]
            moves = [abs(left[k][j] - right[k][j]) for k in keys for j in (0, 1)]
            if moves:
                rows.append({"measure": (PAIRED if paired else "") + m.name, "scale": m.scale, "ends": len(moves),
                             "max": float(max(moves)), "p95": float(np.quantile(moves, 0.95))})
    return rows


def _control_drift(a: Path, b: Path) -> list[dict]:
    """Each planted control's own drift (key CONTROL_KEY + claim): the move,
    row by row between the two runs, of a row's least margin (the nearer of
    its positive's and negative's CI ends to the threshold each turned on),
    which is what controls.py compares with it.  A side far from its
    threshold (a negative's hit@1 at 19 thresholds) moves by more without
    coming nearer a flip; counting its move would hide the plant that
    does."""
    left, right = _table(a, "controls"), _table(b, "controls")
    if left is None or right is None or "positive_margin" not in left.columns or "positive_margin" not in right.columns:
        return []
    keys = [k for k in ("model", "seed", "modality", "claim", "negative") if k in left.columns and k in right.columns]
    least = pl.min_horizontal(pl.col("positive_margin"), pl.col("negative_margin")).alias("least")
    joined = left.select(*keys, least).join(right.select(*keys, least), on=keys, suffix="_b")
    moves = (joined.drop_nulls(["least", "least_b"]).group_by("claim", maintain_order=True)
             .agg(move=(pl.col("least") - pl.col("least_b")).abs()))
    return [{"measure": CONTROL_KEY + claim, "scale": "control", "ends": len(move), "max": float(max(move)),
             "p95": float(np.quantile(move, 0.95))} for claim, move in moves.iter_rows()]


def margins_of(drifts: list[pl.DataFrame]) -> dict[str, float]:
    """Each measure's margin: its largest move over every pair, of its
    table's CI ends and of the judge's item-cell intervals; a rate's paired
    difference moves by its measured paired drift where the run has item
    cells, else by at most the sum of its two rates' moves."""
    table = pl.concat(drifts).group_by("measure", "scale").agg(pl.col("max").max())
    out = dict(table.select("measure", "max").iter_rows())
    for measure, scale, largest in table.sort("measure").iter_rows():
        if scale == RATE and not measure.startswith(PAIRED) and PAIRED + measure not in out:
            out[PAIRED + measure] = 2 * largest
    return dict(sorted(out.items()))


def load() -> dict[str, float]:
    """The stored margins (measure -> margin); empty where none was measured."""
    if not MARGINS.is_file():
        return {}
    return {k: float(v) for k, v in json.loads(MARGINS.read_text())["margins"].items()}


def margin_for(measure: str, paired_rate: bool, stored: dict[str, float]) -> float | None:
    """The margin of one claim's interval, or None where no pair measured it."""
    return stored.get(PAIRED + measure if paired_rate else measure)

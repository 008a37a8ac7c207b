"""A value claim's number from a run's tables: its seed-level interval
(intervals.py), the seeds' heterogeneity and what the run could see
(power.py), ready for the one decision rule (decision.py).

Where the measure has item cells (the item_cells table: paper A's rates
per author and seed) the interval is the crossed layout's, a comparison
with another variant (its parent, its reference, a selector) a paired
difference per author and seed.  Elsewhere it is built from each seed's
own estimate and CI (`intervals.seed_points`, conservative), and with one
seed from that seed's CI (its normal equivalent).  A one-run audit bound
is its own exact one-sided interval (`BoundInterval`).  Beside the
interval: Simonsohn's small-telescopes reading against the paper's CI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from canary_audit.verdicts import power
from canary_audit.verdicts.decision import Claimed
from canary_audit.verdicts.intervals import (
    CONTINUOUS,
    Heterogeneity,
    Interval,
    gail_simon,
    heterogeneity,
    interval,
    seed_points,
)
from canary_audit.verdicts.readings import Run
from canary_audit.views.audit_bound import epsilon_lower
from canary_audit.views.seeds import CELLS_TABLE

if TYPE_CHECKING:
    from canary_audit.verdicts.claims import Claim

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Point:
    """One seed's reading of a value measure from its table row."""

    label: str
    value: float
    lo: float | None
    hi: float | None
    versus: float  # what it is compared with (0 for a paired Delta)
    source: str


@dataclass(frozen=True)
class Evidence:
    interval: Interval
    claimed: Claimed
    heterogeneity: Heterogeneity | None
    power: str
    seeds: int
    per_seed: str
    source: str


def _fmt(value: float, lo: float, hi: float) -> str:
    return f"{value:.3g} [{lo:.3g}, {hi:.3g}]"


def cell_matrix(run: Run, column: str, names: list[str], others: dict[str, str] | None) -> np.ndarray | str:
    """Seeds x authors of `column` for `names` (one per seed), each minus
    its `others` variant's cell (a paired difference) where given; a
    string saying what is missing where the run lacks a cell."""
    cells = run.table(CELLS_TABLE)
    if cells is None:
        return f"no `{CELLS_TABLE}` table in this run"
    cells = cells.filter(pl.col("column") == column)
    wanted = [*names, *(others or {}).values()]
    by = {n: dict(zip(*cells.filter(pl.col("variant") == n).select("group_id", "value").get_columns(), strict=True))
          for n in wanted}
    empty = [n for n in wanted if not by[n]]
    if empty:
        return f"no `{column}` cells of {', '.join(empty)} in `{CELLS_TABLE}`"
    items = sorted(set.intersection(*(set(by[n]) for n in wanted)))
    # The compared variants' authors; a twin may hold more (a relearning on a
    # share of the authors is read on the rest: views/recovery.held_out).
    every = set.union(*(set(by[n]) for n in names))
    if len(items) < len(every):
        return (f"`{CELLS_TABLE}`: {len(every) - len(items)} of {len(every)} authors lack a `{column}` cell under "
                "some seed or comparison: the seed x author layout is incomplete")
    rows = []
    for n in names:
        row = np.array([by[n][i] for i in items], dtype=float)
        if others:
            row = row - np.array([by[others[n]][i] for i in items], dtype=float)
        rows.append(row)
    return np.vstack(rows)


def from_cells(matrix: np.ndarray, scale: str, claimed: Claimed, labels: list[str], source: str) -> Evidence:
    iv = interval(matrix, scale)
    c = iv.components
    per_seed = "; ".join(f"{label}: {m:.3g}" for label, m in zip(labels, c.seed_means, strict=True))
    effect = None if claimed.effect is None else claimed.effect - claimed.null
    return Evidence(iv, claimed, heterogeneity(c, claimed.null), power.power(c, effect).text, c.seeds, per_seed,
                    source)


def _se(point: Point) -> float | None:
    if point.lo is None or point.hi is None or math.isnan(point.lo) or math.isnan(point.hi):
        return None
    return (point.hi - point.lo) / (2 * Z95)


def from_points(points: list[Point], scale: str, claimed: Claimed) -> Evidence | str:
    """From each seed's estimate and CI (no item cells)."""
    ses = [_se(p) for p in points]
    if any(se is None for se in ses):
        missing = [p.label for p, se in zip(points, ses, strict=True) if se is None]
        return f"no CI for {', '.join(missing)}: nothing to judge a seed-level interval by"
    values = [p.value for p in points]
    per_seed = "; ".join(f"{p.label}: {_fmt(p.value, p.lo, p.hi)}" for p in points)
    if len(points) == 1:
        p = points[0]
        iv = Interval(p.value, scale, None, "the table's CI (normal equivalent; one seed, no item cells)", ses[0],
                      math.inf)
        het = None
    else:
        iv = seed_points(values, ses, scale)
        q, q_p = gail_simon(values, ses, claimed.null)
        het = Heterogeneity(math.nan, math.nan, q, q_p, tuple(int(np.sign(v - claimed.null)) for v in values))
    return Evidence(iv, claimed, het, power.from_se(iv.se, iv.df), len(points), per_seed,
                    "; ".join(p.source for p in points[:1]))



@dataclass(frozen=True)
class BoundInterval(Interval):
    """The one-run audit's bound as an interval (views/audit_bound.py):
    [epsilon_lower, inf) at each level, from `correct` right guesses of
    `guesses` with the level spent over `tests` (the grid and the scores
    the table searched): one-sided and exact, with no upper end, since a
    lower bound shows leakage and never its absence.  So a claim that the
    bound exceeds a number can hold, one that it stays below can be
    contradicted (the bound certifies more) and never hold."""

    guesses: int = 0
    correct: int = 0
    tests: int = 1

    def at(self, level: float = 0.95) -> tuple[float, float]:
        return epsilon_lower(self.guesses, self.correct, (1.0 - level) / self.tests), math.inf


def from_bound(row: dict, claimed: Claimed, label: str, source: str) -> Evidence:
    """A claim on the audit bound from its table row: one training run, or
    a family's seeds pooled (`seeds` runs)."""
    iv = BoundInterval(float(row["epsilon_lower"]), CONTINUOUS, None,
                       f"the one-run audit bound: exact binomial tail, one-sided, Bonferroni over {row['tests']} "
                       "tries", math.nan, math.inf, guesses=int(row["guesses"]), correct=int(row["correct"]),
                       tests=int(row["tests"]))
    power = (f"a lower bound shows leakage, never its absence; every one of the {row['candidates']} candidates "
             f"guessed right would certify {float(row['cap']):.3g}")
    return Evidence(iv, claimed, None, power, int(row.get("seeds") or 1),
                    f"{label}: {float(row['epsilon_lower']):.3g} ({row['correct']} of {row['guesses']} guesses "
                    "right)", source)


def small_telescopes(claim: Claim, found: Evidence) -> str:
    """Simonsohn's (2015) reading against the paper's own precision: d33,
    the effect the paper had 33% power to detect (1.52 of its SE, from its
    reported CI), against this run's one-sided 95% bound; "" where the
    paper states no CI."""
    ci = (claim.paper or {}).get("ci")
    if not ci or found.claimed.expect == "within":
        return ""
    se = (ci[1] - ci[0]) / (2 * Z95)
    sign = 1 if found.claimed.expect == "higher" else -1
    d33 = sign * 1.5235 * se  # z_{0.975} - z_{0.67}: 33% power at the paper's SE
    lo, hi = found.interval.at(0.90)
    bound = (hi if sign > 0 else lo) - found.claimed.null
    smaller = bound < d33 if sign > 0 else bound > d33
    return (f"d33 = {d33:+.3g} (the paper's SE {se:.3g}); this run's one-sided 95% bound {bound:+.3g} "
            + ("lies short of it: an effect too small for the paper to have seen" if smaller else
               "does not exclude it"))

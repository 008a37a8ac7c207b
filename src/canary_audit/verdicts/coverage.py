"""Coverage by simulation: does an interval cover its true mean at the rate
it claims?  Seed x item tables are drawn with known seed, item and
residual variance (y = mu + a_s + b_i + e_si), or as binary cells near 0
or 1 (a probit: y = 1[eta + a_s + b_i + z > 0], whose true mean is
Phi(eta / sqrt(1 + s2_seed + s2_item))), and each method's 95% interval is
checked against the truth.  tests/test_intervals.py runs it on a fixed
generator; benchmarks/coverage.py prints the table docs/measures.md gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from canary_audit.verdicts.intervals import CONTINUOUS, RATE, interval


@dataclass(frozen=True)
class Scenario:
    name: str
    var_seed: float
    var_item: float
    var_resid: float
    eta: float | None = None  # binary cells: the probit's location; None: normal cells

    @property
    def truth(self) -> float:
        if self.eta is None:
            return 0.0
        return float(stats.norm.cdf(self.eta / math.sqrt(1.0 + self.var_seed + self.var_item)))

    @property
    def scale(self) -> str:
        return RATE if self.eta is not None else CONTINUOUS

    def draw(self, seeds: int, items: int, rng: np.random.Generator) -> np.ndarray:
        a = rng.normal(0.0, math.sqrt(self.var_seed), (seeds, 1))
        b = rng.normal(0.0, math.sqrt(self.var_item), (1, items))
        if self.eta is None:
            return a + b + rng.normal(0.0, math.sqrt(self.var_resid), (seeds, items))
        return (self.eta + a + b + rng.normal(0.0, 1.0, (seeds, items)) > 0).astype(float)


SCENARIOS = (
    Scenario("seed-dominant", 1.0, 0.1, 0.5),
    Scenario("item-dominant", 0.05, 1.0, 0.5),
    Scenario("balanced", 0.5, 0.5, 0.5),
    Scenario("no seed variance", 0.0, 0.5, 0.5),
    Scenario("binary near 0", 0.3, 0.5, 1.0, eta=-1.8),
    Scenario("binary near 1", 0.3, 0.5, 1.0, eta=1.8),
)


def crossed_interval(cells: np.ndarray, scale: str) -> tuple[float, float]:
    """The interval the judge uses (intervals.interval)."""
    return interval(cells, scale).at(0.95)


def seed_t_interval(cells: np.ndarray, scale: str) -> tuple[float, float]:
    """The old one: a t interval over the seeds' means (item variance dropped)."""
    means = cells.mean(axis=1)
    s = len(means)
    half = float(stats.t.ppf(0.975, s - 1)) * float(np.std(means, ddof=1)) / math.sqrt(s)
    return float(means.mean()) - half, float(means.mean()) + half


def coverage(method: Callable[[np.ndarray, str], tuple[float, float]], scenario: Scenario, seeds: int, items: int,
             trials: int, rng: np.random.Generator) -> float:
    """The share of `trials` tables whose interval covers the truth."""
    hits = 0
    for _ in range(trials):
        lo, hi = method(scenario.draw(seeds, items, rng), scenario.scale)
        hits += lo <= scenario.truth <= hi
    return hits / trials


def mc_se(p: float, trials: int) -> float:
    """The Monte Carlo standard error of a coverage estimated from `trials`."""
    return math.sqrt(p * (1 - p) / trials)

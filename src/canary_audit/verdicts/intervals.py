"""Seed-level intervals from the crossed seed x item layout.

Every training seed reads the same synthetic authors or canaries (items),
so a run's cells form a crossed table: y[s, i] = mu + a_s + b_i + e_si.
The item effects b_i are shared by all seeds and do not shrink as seeds
are added; a per-seed meta-analysis treats them as independent (too narrow)
and a t interval over seed means drops them (too narrow where items vary,
zero width where the seeds agree).

The interval here is built on Clark's (1973) variance components for the
crossed layout: from the two-way ANOVA's mean squares, Var(grand mean) =
s2_seed/S + s2_item/I + s2_resid/(S I), estimated by (max(MS_seed
- MS_resid, 0) + MS_item) / (S I) from 3 seeds up.  The two terms rest on
S - 1 and I - 1 degrees of freedom; the critical value is Cochran and
Cox's (1950) weighted t, t* = sum_k w_k t_{df_k} / sum_k w_k (w_k a
term's share of the variance).  Satterthwaite's (1946) single df
under-covers here (measured: 0.92 at 3 seeds with balanced components),
because with 2 seed df its estimate jumps when MS_seed comes out small.
At 2 seeds, and for rates, the residual is not subtracted (MS_seed + MS_item,
an excess of s2_resid / (S I)): subtracted, 2 seeds cover 0.91 and binary
cells near 0 or 1 at 3 seeds 0.90-0.92; kept, 2 seeds cover 0.93-0.99 and
rates from 3 seeds 0.98-0.99 (benchmarks/coverage.py, docs/measures.md).  It assumes normal seed and item effects: no
distribution-free 95% interval exists from 3 seeds (the range of 3 draws
covers their median with probability 1 - 2/2^3 = 75%, and a seed
bootstrap has 10 multisets to draw).

Rates are bounded: Clopper-Pearson (1934) where one seed reads binary
cells (k of n), Korn-Graubard (1998) otherwise (the Clopper-Pearson
interval at the effective n = p(1-p)/Var, shrunk by the ratio of t
quantiles for the design's degrees of freedom).  Differences of rates are
clipped to [-1, 1].

Tests beside the interval: F = MS_seed / MS_resid for any seed difference
and Gail-Simon (1985) for a qualitative one (seeds on both sides of the
null beyond their noise, MS_resid / I per seed: the items are common to
the seeds, so their effects cancel in a seed contrast).

scipy is imported where a quantile is taken, not at the top: the
Snakefile's design imports this module (through the claims it checks at
parse time) and takes none, and `scipy.stats` was 0.6 s of its 0.9 s
import, paid by every Snakemake start and every SLURM job step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RATE, DIFFERENCE, CONTINUOUS = "rate", "difference", "continuous"
SCALES = (RATE, DIFFERENCE, CONTINUOUS)


class LayoutError(ValueError):
    """Cells that do not form a complete seed x item table."""


@dataclass(frozen=True)
class Components:
    """The crossed layout's mean squares and variance components.

    With one seed the seed component cannot be estimated (`var_seed` is
    NaN) and item and residual variance are one (`var_item`)."""

    seeds: int
    items: int
    mean: float
    seed_means: tuple[float, ...]
    ms_seed: float
    ms_item: float
    ms_resid: float
    var_seed: float
    var_item: float
    var_resid: float
    terms: tuple[tuple[float, float], ...]  # (a part of Var(grand mean), its df)
    binary: bool  # every cell is 0 or 1

    @property
    def variance(self) -> float:
        """Of the grand mean."""
        return sum(part for part, _ in self.terms)

    @property
    def se(self) -> float:
        return math.sqrt(self.variance)

    def critical(self, q: float) -> float:
        """Cochran and Cox's t*: the terms' t quantiles weighted by their parts."""
        return weighted_t(self.terms, q)

    @property
    def df(self) -> float:
        """The df whose 97.5% t quantile is t* (for printing)."""
        return effective_df(self.terms)


def weighted_t(terms, q: float) -> float:
    total = sum(part for part, _ in terms)
    if total <= 0:
        return _t(q, math.inf)
    return sum(part * _t(q, df) for part, df in terms) / total


def effective_df(terms) -> float:
    target = weighted_t(terms, 0.975)
    if target <= _t(0.975, 1e7):
        return math.inf
    from scipy import optimize

    return float(optimize.brentq(lambda df: _t(0.975, df) - target, 0.05, 1e7))


def crossed(cells: np.ndarray, subtract: bool = False) -> Components:
    """The components of a seeds x items array of cell values (one cell: one
    seed's mean over one item's observations).  `subtract`: the seed term
    is (MS_seed - MS_resid)/(S I), at least 0, so Var counts the residual
    once (unbiased but for the truncation); else MS_seed/(S I)."""
    y = np.asarray(cells, dtype=float)
    if y.ndim != 2 or y.shape[1] < 2 or np.isnan(y).any():
        raise LayoutError(f"a seed x item table needs every item under every seed and >= 2 items; got shape "
                          f"{y.shape} with {int(np.isnan(y).sum()) if y.size else 0} missing cells")
    s, i = y.shape
    mean, seed_means, item_means = float(y.mean()), y.mean(axis=1), y.mean(axis=0)
    binary = bool(np.isin(y, (0.0, 1.0)).all())
    ms_item = float(s * ((item_means - mean) ** 2).sum() / (i - 1))
    if s == 1:
        return Components(1, i, mean, (mean,), math.nan, ms_item, math.nan, math.nan, ms_item, 0.0,
                          ((ms_item / i, float(i - 1)),), binary)
    ms_seed = float(i * ((seed_means - mean) ** 2).sum() / (s - 1))
    resid = y - seed_means[:, None] - item_means[None, :] + mean
    ms_resid = float((resid ** 2).sum() / ((s - 1) * (i - 1)))
    var_seed, var_item = max(0.0, (ms_seed - ms_resid) / i), max(0.0, (ms_item - ms_resid) / s)
    seed_part = max(0.0, ms_seed - ms_resid) if subtract else ms_seed
    terms = ((seed_part / (s * i), float(s - 1)), (ms_item / (s * i), float(i - 1)))
    return Components(s, i, mean, tuple(float(m) for m in seed_means), ms_seed, ms_item, ms_resid, var_seed,
                      var_item, ms_resid, terms, binary)


@dataclass(frozen=True)
class Interval:
    """A seed-level estimate whose interval can be drawn at any level (the
    judge's 95%, TOST's 90%, a Holm step's), named by its method."""

    estimate: float
    scale: str
    components: Components | None
    method: str
    se: float
    df: float

    def at(self, level: float = 0.95) -> tuple[float, float]:
        c, alpha = self.components, 1.0 - level
        if self.scale == RATE and c is not None:
            if c.seeds == 1 and c.binary:
                return clopper_pearson(round(c.mean * c.items), c.items, level)
            return korn_graubard(c.mean, c.variance, c.seeds * c.items, c.critical(1 - alpha / 2), level)
        if self.se == 0 or math.isnan(self.se):
            lo = hi = self.estimate
        else:
            half = (c.critical(1 - alpha / 2) if c is not None else _t(1 - alpha / 2, self.df)) * self.se
            lo, hi = self.estimate - half, self.estimate + half
        if self.scale == DIFFERENCE:
            lo, hi = max(lo, -1.0), min(hi, 1.0)
        elif self.scale == RATE:
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        return lo, hi

    def p_value(self, null: float) -> float:
        """Two-sided: the least alpha whose 1 - alpha interval excludes
        `null` (found by bisection, so it matches `at` for every method)."""
        lo, hi = self.at(1e-9)
        if lo <= null <= hi:
            return 1.0
        low, high = 1e-12, 1.0 - 1e-9  # alpha: excludes at `high`, test `low`
        lo, hi = self.at(1.0 - low)
        if not lo <= null <= hi:
            return low
        for _ in range(60):
            mid = (low + high) / 2
            lo, hi = self.at(1.0 - mid)
            if lo <= null <= hi:
                low = mid
            else:
                high = mid
        return high


def _t(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.norm.ppf(q) if math.isinf(df) or df > 1e6 else stats.t.ppf(q, df))


def interval(cells: np.ndarray, scale: str) -> Interval:
    """The seed-level interval of a seeds x items table of cells."""
    if scale not in SCALES:
        raise ValueError(f"scale `{scale}`: one of {', '.join(SCALES)}")
    y = np.asarray(cells, dtype=float)
    c = crossed(y, subtract=scale != RATE and y.ndim == 2 and y.shape[0] >= 3)
    if c.seeds == 1:
        method = ("Clopper-Pearson over items (one seed)" if scale == RATE and c.binary else
                  f"t over items (one seed, {c.items} items)" if scale != RATE else
                  "Korn-Graubard over items (one seed)")
    else:
        method = (f"variance components (Clark 1973) over {c.seeds} seeds x {c.items} items, Cochran-Cox t* "
                  f"{c.critical(0.975):.2f}; assumes normal seed effects"
                  + ("; Korn-Graubard bounds" if scale == RATE else ""))
    return Interval(c.mean, scale, c, method, c.se, math.nan)  # with components, `at` reads their t*


def seed_points(values: list[float], ses: list[float], scale: str) -> Interval:
    """Where a measure has no item-level cells, only each seed's estimate
    and SE: Var = var(seed estimates)/S + mean(SE^2).  Conservative when the
    items are shared (the residual counts twice) and when each seed draws
    its own items (coin inclusion: the seed estimates' variance holds the
    items' already), never narrower than the crossed interval in
    expectation.  Its critical value is t on the seed term's own S - 1 df:
    Satterthwaite's df over the two terms, estimated from as few as 3
    seeds, is large exactly where the seed estimates happen to agree, and
    under-covered (0.924-0.932 over 4,000 simulated tables where seeds dominate;
    tests/test_intervals.py)."""
    s = len(values)
    between = float(np.var(values, ddof=1)) / s if s > 1 else 0.0
    within = float(np.mean(np.square(ses)))
    return Interval(float(np.mean(values)), scale, None,
                    f"seed estimates and their SEs over {s} seeds (no item cells: conservative, t on {s - 1} df)",
                    math.sqrt(between + within), float(s - 1) if s > 1 else math.inf)


def clopper_pearson(k: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval for k of n (k, n may be effective, non-integer)."""
    from scipy import stats

    alpha = 1.0 - level
    lo = 0.0 if k <= 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k >= n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def korn_graubard(p: float, variance: float, n: int, critical: float, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson at the design's effective n (Korn & Graubard 1998):
    n_eff = p(1-p)/Var, times (t_{n-1} / t*)^2 for the design's critical
    value t* at `level`, at most n; n itself where p is 0 or 1 or Var is 0."""
    alpha = 1.0 - level
    if 0 < p < 1 and variance > 0:
        shrink = (_t(1 - alpha / 2, n - 1) / critical) ** 2 if n > 1 else 1.0
        n_eff = min(float(n), p * (1 - p) / variance * shrink)
    else:
        n_eff = float(n)
    return clopper_pearson(p * n_eff, n_eff, level)


@dataclass(frozen=True)
class Heterogeneity:
    """Whether the seeds differ: F for any difference, Gail-Simon for a
    difference in direction about `null`."""

    f: float
    f_p: float
    q: float  # Gail-Simon min(Q+, Q-)
    q_p: float
    signs: tuple[int, ...]

    @property
    def qualitative(self) -> bool:
        return self.q_p < 0.05

    def text(self) -> str:
        qualitative = f"Gail-Simon Q = {self.q:.3g} (p = {self.q_p:.3g})"
        return qualitative if math.isnan(self.f) else f"F = {self.f:.3g} (p = {self.f_p:.3g}); {qualitative}"


def heterogeneity(c: Components, null: float) -> Heterogeneity | None:
    """The two tests on the crossed layout (None with one seed)."""
    if c.seeds < 2:
        return None
    if c.ms_resid > 0:
        from scipy import stats

        f = c.ms_seed / c.ms_resid
        f_p = float(stats.f.sf(f, c.seeds - 1, (c.seeds - 1) * (c.items - 1)))
    else:
        f, f_p = (math.inf, 0.0) if c.ms_seed > 0 else (math.nan, 1.0)
    q, q_p = gail_simon(c.seed_means, [math.sqrt(c.ms_resid / c.items)] * c.seeds, null)
    return Heterogeneity(f, f_p, q, q_p, tuple(int(np.sign(m - null)) for m in c.seed_means))


def gail_simon(estimates, ses, null: float) -> tuple[float, float]:
    """(min(Q+, Q-), its p-value): Gail and Simon's (1985) likelihood-ratio
    test that the seeds' effects lie on both sides of `null`."""
    d, se = np.asarray(estimates, dtype=float) - null, np.asarray(ses, dtype=float)
    if (se <= 0).any():
        q = math.inf if (d > 0).any() and (d < 0).any() else 0.0
    else:
        z2 = d * d / (se * se)
        q = float(min(z2[d > 0].sum(), z2[d < 0].sum()))
    return q, gail_simon_p(q, len(d))


def gail_simon_p(q: float, strata: int) -> float:
    """P(min(Q+, Q-) >= q) at the least favourable null (Gail & Simon 1985):
    sum over h = 1..k-1 of (1 - F_h(q)) Binom(h; k-1, 1/2)."""
    if q <= 0:
        return 1.0
    if math.isinf(q):
        return 0.0
    from scipy import stats

    k = strata
    return float(sum(stats.chi2.sf(q, h) * stats.binom.pmf(h, k - 1, 0.5) for h in range(1, k)))

"""What a run could have seen: power from its own variance components.

A verdict of `inconclusive` is only useful beside the smallest effect the
run could detect.  From the crossed layout's components (intervals.py),
the standard error of the grand mean at S seeds and I items is
sqrt(s2_seed/S + s2_item/I + s2_resid/(S I)); the smallest effect a
two-sided level-alpha test detects with power 1 - beta is
(t_{1-alpha/2} + t_{1-beta}) x SE (Miller 2024, "Adding Error Bars to
Evals", sec. 5), each quantile weighted over the layout's terms as the
interval weights its t* (Cochran and Cox 1950).
Power is never computed at the observed effect (that is a function of the
p-value and says nothing new).

The seed component rests on S - 1 degrees of freedom (2 at 3 seeds), so
the same statement is also given at its upper 80% limit,
(S - 1) MS_seed / chi2_{0.2, S-1}.  Where the seed component alone keeps
the SE above what the effect needs, no number of items suffices: the
statement says "needs >= S seeds".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from canary_audit.verdicts.intervals import Components, weighted_t

ALPHA, POWER = 0.05, 0.8
MAX_SEEDS, MAX_ITEMS = 1000, 1_000_000


def layout_terms(c: Components, seeds: float, items: float,
                 var_seed: float | None = None) -> tuple[tuple[float, float], ...]:
    """The parts of Var(grand mean) and their df at `seeds` x `items`, from
    the run's components (`var_seed` in place of its seed component): the
    expected mean squares, combined as intervals.crossed combines the
    observed ones."""
    vs = (0.0 if math.isnan(c.var_seed) else c.var_seed) if var_seed is None else var_seed
    vi, ve = c.var_item, c.var_resid
    cells = seeds * items
    terms = [((ve + seeds * vi) / cells, items - 1)]
    if seeds > 1:
        terms.insert(0, ((ve + items * vs) / cells, seeds - 1))
    return tuple(terms)


def detectable(c: Components, seeds: float | None = None, items: float | None = None,
               var_seed: float | None = None, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest effect detectable at 80% power, two-sided 5%: the
    terms' (t_{1-alpha/2} + t_{power}) weighted as Cochran and Cox weight t*."""
    terms = layout_terms(c, seeds or c.seeds, items or c.items, var_seed)
    variance = sum(part for part, _ in terms)
    if variance <= 0:
        return 0.0
    return weighted_t(terms, 1 - alpha / 2) * math.sqrt(variance) + weighted_t(terms, power) * math.sqrt(variance)


def seed_variance_upper(c: Components, level: float = 0.8) -> float:
    """The upper `level` limit of the seed component: (S-1) MS_seed /
    chi2_{1-level, S-1}, less the residual, per item."""
    if c.seeds < 2:
        return math.nan
    upper = (c.seeds - 1) * c.ms_seed / float(stats.chi2.ppf(1 - level, c.seeds - 1))
    return max(0.0, (upper - c.ms_resid) / c.items)


@dataclass(frozen=True)
class Power:
    detectable: float  # at this run's seeds and items
    detectable_upper: float  # at the seed component's upper 80% limit (NaN with one seed)
    seeds_needed: int | None  # at this run's items, for the stated effect
    items_needed: int | None  # at this run's seeds
    seed_bound: bool  # no number of items reaches the effect at this run's seeds
    text: str


def _least(needs, low: int, high: int) -> int | None:
    """The least n in [low, high] with needs(n) true (monotone), or None."""
    if not needs(high):
        return None
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if needs(mid) else (mid + 1, high)
    return low


def power(c: Components, effect: float | None) -> Power:
    """The run's power statement; with a stated `effect`, the seeds and
    items that would detect it."""
    mde = detectable(c)
    upper = seed_variance_upper(c)
    mde_up = detectable(c, var_seed=upper) if not math.isnan(upper) else math.nan
    text = (f"smallest effect detectable at 80% power (two-sided 5%): {mde:.3g} with {c.seeds} "
            f"seed{'s' if c.seeds > 1 else ''} x {c.items} items")
    if c.seeds == 1:
        text += " (one seed: seed variance not estimable, not in this figure)"
    else:
        text += f"; {mde_up:.3g} at the seed variance's upper 80% limit"
    if effect is None or effect == 0:
        return Power(mde, mde_up, None, None, False, text + "; no effect of interest stated")
    size = abs(effect)
    seeds_needed = _least(lambda s: detectable(c, seeds=s) <= size, max(c.seeds, 2), MAX_SEEDS)
    items_needed = _least(lambda i: detectable(c, items=i) <= size, 2, MAX_ITEMS)
    bound = items_needed is None
    if mde <= size:
        text += f"; the stated effect {effect:+.3g} is within reach"
    elif bound:
        least = _least(lambda s: detectable(c, seeds=s, items=MAX_ITEMS) <= size, max(c.seeds, 2), MAX_SEEDS)
        text += (f"; the stated effect {effect:+.3g} needs >= {least} seeds whatever the items" if least else
                 f"; the stated effect {effect:+.3g} is out of reach of {MAX_SEEDS} seeds")
    else:
        text += (f"; the stated effect {effect:+.3g} needs {items_needed} items at {c.seeds} seeds"
                 + (f" or {seeds_needed} seeds at {c.items} items" if seeds_needed and c.seeds > 1 else ""))
    return Power(mde, mde_up, seeds_needed, items_needed, bound, text)


def from_se(se: float, df: float) -> str:
    """The statement where only an SE is known (no item cells)."""
    terms = ((se * se, df),)
    return (f"smallest effect detectable at 80% power (two-sided 5%): "
            f"{(weighted_t(terms, 1 - ALPHA / 2) + weighted_t(terms, POWER)) * se:.3g} "
            "(from the seeds' SEs; no item cells to project seeds or items)")

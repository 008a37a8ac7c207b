"""One decision rule for every claim: the papers' and a researcher's own.

A claim states a null (what it is compared with) and a side (`higher`,
`lower`), or a band it expects the value within; it may state an effect of
interest (the paper's value, the user's `effect`) and an equivalence
margin (the smallest effect that would matter).  From the seed-level
interval (intervals.py) the verdict is one of:

- `holds`: the 95% CI lies wholly on the claim's side of the null; the
  qualifier says whether it is consistent with, smaller or larger than the
  effect of interest.  A band claim holds where its 90% CI lies inside the
  band (two one-sided tests, TOST, at 5% each: Schuirmann 1987).
- `contradicted`: the 95% CI lies wholly on the other side of the null, or
  its 90% CI wholly inside the stated equivalence band (TOST); a band claim
  is contradicted where its 95% CI lies wholly outside the band.
- `inconclusive`: the CI covers the null; the power statement beside it
  says what the run could have seen (`below the floor` is this case where a
  detection floor is the bound).
- `seed-dependent`: the seeds differ in direction by Gail and Simon's (1985)
  test on the seed x item layout.  A seed significant where another is
  not is no evidence of that; heterogeneity short of the test only widens
  the interval (its seed component).
- `not testable`: a row, an interval or a precondition is missing, or the
  stated value lies past the measure's ceiling.

`borderline` is a flag beside a verdict: a CI end lies within the stated
margin (docs/reliability.md: the drift of two runs of one config that
differ only in float order) of the threshold the verdict turned on.

A family of claims (the papers' value claims; a user's claim file) is
judged at a family-wise 5%: Holm's (1979) step-down on the claims' p-values
(each the least alpha at which the claim's interval excludes its null).
"""

from __future__ import annotations

from dataclasses import dataclass

from canary_audit.verdicts.intervals import Heterogeneity, Interval

HOLDS, CONTRADICTED, INCONCLUSIVE, SEED_DEPENDENT, NOT_TESTABLE = (
    "holds", "contradicted", "inconclusive", "seed-dependent", "not testable")
VERDICTS = (HOLDS, CONTRADICTED, INCONCLUSIVE, SEED_DEPENDENT, NOT_TESTABLE)
BORDERLINE = "borderline"
ALPHA = 0.05


@dataclass(frozen=True)
class Claimed:
    """What a claim states of one number."""

    null: float
    expect: str  # "higher", "lower" or "within"
    band: tuple[float, float] | None = None  # for "within": the value's low and high
    effect: float | None = None  # the effect of interest, on the estimate's scale (a value, not a difference)
    equivalence: float | None = None  # half-width of a band about the null where no effect matters

    def __post_init__(self) -> None:
        if self.expect not in ("higher", "lower", "within"):
            raise ValueError(f"expect `{self.expect}`: one of higher, lower, within")
        if (self.expect == "within") != (self.band is not None):
            raise ValueError("a band claim (expect within) needs its band, and only it has one")


@dataclass(frozen=True)
class Decision:
    verdict: str
    qualifier: str
    borderline: bool | None  # None: no margin measured for its measure
    why: str
    p_value: float  # against the null, before any adjustment


def _fmt(lo: float, hi: float) -> str:
    return f"[{lo:.3g}, {hi:.3g}]"


def _qualifier(lo: float, hi: float, claimed: Claimed) -> str:
    effect = claimed.effect
    if effect is None:
        return ""
    if lo <= effect <= hi:
        return "consistent with the stated effect"
    closer = hi < effect if effect > claimed.null else lo > effect
    return "smaller than the stated effect" if closer else "larger than the stated effect"


def _near(values: tuple[float, ...], thresholds: tuple[float, ...], margin: float) -> bool:
    return margin > 0 and any(abs(v - t) <= margin for v in values for t in thresholds)


def decide(interval: Interval, claimed: Claimed, *, p_adjusted: float | None = None, alpha: float = ALPHA,
           margin: float = 0.0, heterogeneity: Heterogeneity | None = None, adjusted: str = "") -> Decision:
    """The verdict of one claim on its interval.  `p_adjusted`: the claim's
    Holm-adjusted p-value in its family (`adjusted` names the family), in
    place of its own for the side of the null."""
    lo, hi = interval.at(1 - alpha)
    lo90, hi90 = interval.at(1 - 2 * alpha)
    p = p_value(interval, claimed)
    if heterogeneity is not None and heterogeneity.qualitative:
        return Decision(SEED_DEPENDENT, "", False, f"the seeds lie on both sides of {claimed.null:.3g}: "
                        f"{heterogeneity.text()}", p)
    if claimed.expect == "within":
        low, high = claimed.band
        if low <= lo90 and hi90 <= high and p_adjusted is not None and p_adjusted >= alpha:
            return Decision(INCONCLUSIVE, "", _near((lo90, hi90), (low, high), margin),
                            f"TOST: the 90% CI {_fmt(lo90, hi90)} lies within [{low:.3g}, {high:.3g}], but not at "
                            f"the family's level ({adjusted}: Holm-adjusted p = {p_adjusted:.3g})", p)
        if low <= lo90 and hi90 <= high:
            return Decision(HOLDS, "", _near((lo90, hi90), (low, high), margin),
                            f"TOST: the 90% CI {_fmt(lo90, hi90)} lies within [{low:.3g}, {high:.3g}]", p)
        if hi < low or lo > high:
            return Decision(CONTRADICTED, "", _near((lo, hi), (low, high), margin),
                            f"the 95% CI {_fmt(lo, hi)} lies outside [{low:.3g}, {high:.3g}]", p)
        return Decision(INCONCLUSIVE, "", _near((lo90, hi90, lo, hi), (low, high), margin),
                        f"the CI {_fmt(lo, hi)} reaches past [{low:.3g}, {high:.3g}]", p)
    sign = 1 if claimed.expect == "higher" else -1
    null = claimed.null
    excluded = (p_adjusted if p_adjusted is not None else p) < alpha
    side = 0
    if lo > null:
        side = sign
    elif hi < null:
        side = -sign
    edge = _near((lo, hi), (null,), margin)
    where = f"the 95% CI {_fmt(lo, hi)}"
    if side and not excluded:
        return Decision(INCONCLUSIVE, "", edge, f"{where} excludes {null:.3g}, but not at the family's level "
                        f"({adjusted}: Holm-adjusted p = {p_adjusted:.3g})", p)
    if side > 0:
        return Decision(HOLDS, _qualifier(lo, hi, claimed), edge,
                        f"{where} lies above {null:.3g}" if sign > 0 else f"{where} lies below {null:.3g}", p)
    if side < 0:
        return Decision(CONTRADICTED, "", edge,
                        f"{where} lies below {null:.3g}" if sign > 0 else f"{where} lies above {null:.3g}", p)
    if claimed.equivalence is not None:
        band = (null - claimed.equivalence, null + claimed.equivalence)
        if band[0] <= lo90 and hi90 <= band[1]:
            return Decision(CONTRADICTED, "", _near((lo90, hi90), band, margin),
                            f"TOST: the 90% CI {_fmt(lo90, hi90)} lies within {null:.3g} +- {claimed.equivalence:.3g}"
                            ": no effect of the stated size", p)
    return Decision(INCONCLUSIVE, "", edge, f"{where} covers {null:.3g}", p)


def p_value(interval: Interval, claimed: Claimed) -> float:
    """The claim's own p-value, the one its family adjusts: against the
    null (two-sided, the least alpha whose interval excludes it) for a
    side; for a band, TOST's (the least alpha whose 1 - 2 alpha interval
    lies inside the band; 1 where its estimate lies outside)."""
    if claimed.expect != "within":
        return interval.p_value(claimed.null)
    low, high = claimed.band

    def inside(alpha: float) -> bool:
        lo, hi = interval.at(1 - 2 * alpha)
        return low <= lo and hi <= high

    if not inside(0.5 - 1e-9):
        return 1.0
    small, large = 1e-12, 0.5 - 1e-9  # inside at `large`; find the least alpha
    if inside(small):
        return small
    for _ in range(60):
        mid = (small + large) / 2
        small, large = (small, mid) if inside(mid) else (mid, large)
    return large


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda j: p_values[j])
    adjusted, running = [1.0] * m, 0.0
    for rank, j in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[j]))
        adjusted[j] = running
    return adjusted

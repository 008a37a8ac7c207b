"""The one-run privacy audit's bound (Steinke, Nasr and Jagielski, NeurIPS
2023, "Privacy auditing with one (1) training run"): a lower bound on
epsilon, at confidence 1 - beta, from the membership guesses on canaries
that were each included in training by a fair coin.

Their theorem (delta = 0): if training is epsilon-DP, the number W of
correct guesses among r guesses (an attacker may abstain on the rest) is
stochastically dominated by Binomial(r, e^eps / (1 + e^eps)), whatever the
attacker.  Observing W = v therefore rejects every epsilon whose tail
P[Binomial(r, p_eps) >= v] is below beta; the bound is the least epsilon
not rejected.  Since P[Binomial(r, p) >= v] is the regularized incomplete
beta function I_p(v, r - v + 1), that epsilon is the logit of the beta
quantile p* = Beta^-1(beta; v, r - v + 1) (Clopper-Pearson's one-sided
lower limit), floored at 0.  With every guess right it is the cap
logit(beta^(1/r)): 40 candidates cap it at 2.55 at 95% confidence.

The guesser here abstains: it guesses "member" on the k+ highest scores
and "non-member" on the k- lowest.  A k chosen by looking at the data is a
search: `search_bound` spends beta over the grid and the scores it tried
(Bonferroni), so the bound it reports keeps its confidence.

The bound is numpy and scipy, `bound_table` its polars view over the
records' membership scores; what is validated (tests/test_audit_bound.py):
over mechanisms of known epsilon the bound exceeds the true epsilon in at
most beta of trials, is 0 in at least 1 - beta of trials when the scores
are independent of membership, and both fail with the wrong binomial tail.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from canary_audit.views.mia import ATTACKS


def epsilon_lower(guesses: int, correct: int, beta: float = 0.05) -> float:
    """The least epsilon (delta = 0) that `correct` right guesses out of
    `guesses` do not reject at level `beta`; 0 where even epsilon = 0
    (a coin's 1/2) is not rejected."""
    from scipy.stats import beta as beta_dist

    if not 0 < beta < 1:
        raise ValueError(f"confidence level beta={beta} must lie strictly between 0 and 1")
    if not 0 <= correct <= guesses:
        raise ValueError(f"{correct} correct guesses out of {guesses}: must lie between 0 and the guesses")
    if correct == 0:
        return 0.0
    p = float(beta_dist.ppf(beta, correct, guesses - correct + 1))  # P[Bin(guesses, p) >= correct] = beta
    return max(0.0, math.log(p / (1 - p))) if p < 1 else math.inf


def cap(candidates: int, beta: float = 0.05) -> float:
    """The largest bound `candidates` canaries can give: every one guessed
    right (the best case; a real attack certifies less)."""
    return epsilon_lower(candidates, candidates, beta)


def candidates_for(epsilon: float, beta: float = 0.05) -> int:
    """The fewest canaries, all guessed right, that certify `epsilon`."""
    r = 1
    while cap(r, beta) < epsilon:
        r *= 2
    lo, hi = r // 2, r
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cap(mid, beta) < epsilon else (lo, mid)
    return hi


CAP_CANDIDATES = (20, 40, 100, 200, 500, 1000, 2000)
CAP_EPSILONS = (1.0, 2.0, 4.0, 6.0)


def render_caps(beta: float = 0.05) -> str:
    """The cap table `plan` prints: what a one-run audit over r candidates
    can certify at best, and the candidates a stated epsilon needs."""
    caps = " | ".join(f"{cap(r, beta):.2f}" for r in CAP_CANDIDATES)
    needs = "; ".join(f"epsilon {e:g} needs {candidates_for(e, beta):,}" for e in CAP_EPSILONS)
    return (f"One-run audit bound (Steinke, Nasr and Jagielski 2023; docs/measures.md): its cap at "
            f"{1 - beta:.0%} confidence, every guess right (the best case: a real attack certifies less)\n\n"
            f"| candidates | {' | '.join(f'{r:,}' for r in CAP_CANDIDATES)} |\n"
            f"|---|{'---|' * len(CAP_CANDIDATES)}\n| epsilon at most | {caps} |\n\n"
            f"Candidates, all guessed right: {needs}.")


@dataclass(frozen=True)
class Guesses:
    """The abstaining guesser's reading at (k+, k-): its guesses and the
    right ones, and the bound they give at `beta`."""

    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    beta: float
    epsilon: float


def guess(scores: np.ndarray, members: np.ndarray, k_plus: int, k_minus: int, beta: float = 0.05) -> Guesses:
    """Guess "member" on the `k_plus` highest scores and "non-member" on the
    `k_minus` lowest (a higher score: more member-like); abstain on the rest.
    Ties are broken by the order given (a stable sort), never by membership."""
    scores, members = np.asarray(scores, dtype=float), np.asarray(members, dtype=bool)
    if scores.shape != members.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and members {members.shape} must be one vector each, alike")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > scores.size:
        raise ValueError(f"k+ = {k_plus} and k- = {k_minus} guesses on {scores.size} candidates: each must be "
                         "at least 0 and together at most the candidates")
    order = np.argsort(-scores, kind="stable")
    top, bottom = order[:k_plus], order[scores.size - k_minus:]
    correct = int(members[top].sum() + (~members[bottom]).sum())
    guesses = k_plus + k_minus
    return Guesses(k_plus, k_minus, guesses, correct, beta, epsilon_lower(guesses, correct, beta))


def search_level(beta: float, grid: list[tuple[int, int]], tried: int = 1) -> float:
    """The level each (k+, k-) of `grid` is tried at, for each of `tried`
    scores searched alike: Bonferroni, so the best of them holds at beta."""
    if not grid:
        raise ValueError("an empty grid of (k+, k-) guesses: name at least one")
    return beta / (len(grid) * tried)


def search_bound(scores: np.ndarray, members: np.ndarray, grid: list[tuple[int, int]], beta: float = 0.05,
                 tried: int = 1) -> Guesses:
    """The best bound over a grid of (k+, k-), each at beta / (len(grid) *
    `tried`): Bonferroni over the grid and over the `tried` scores searched
    alike, so the bound reported holds at 1 - beta whichever was picked."""
    level = search_level(beta, grid, tried)
    return max((guess(scores, members, kp, km, level) for kp, km in grid), key=lambda g: (g.epsilon, -g.guesses))


def grid_of(candidates: int, shares: list[float]) -> list[tuple[int, int]]:
    """The (k+, k-) the guesser may take over `candidates`: for each share
    of them guessed, half on the highest scores and half on the lowest
    (distinct pairs, at least one guess each)."""
    out = []
    for share in shares:
        half = max(1, round(share * candidates / 2))
        pair = (min(half, candidates // 2), min(half, candidates - candidates // 2))
        if pair not in out:
            out.append(pair)
    return out


ANY = "any"  # the row of the best score per variant: the choice among scores is paid for


def bound_table(scores: pl.DataFrame | None, settings: dict[str, str], shares: list[float], beta: float,
                skipped: set[str] = frozenset(), families: dict[str, str] | None = None) -> pl.DataFrame:
    """The one-run bound per variant and coin-drawn population of
    `settings` (population -> its arm: `author` under a prefill arm, `hex`
    under `preamble`; members: the canaries trained, non-members: the
    candidates the coins left out), per score of `attacks` (views/mia.ATTACKS; higher =
    more member-like) and as `any`, the best of them: every (k+, k-) of the
    grid (`grid_of(r, shares)`) and every score is tried at beta / (grid x
    scores), so each row's bound holds at 1 - beta as reported, the `any`
    row included.  Columns: candidates r, members, k+, k-, guesses,
    correct, `tests` (grid x scores), `epsilon_lower` and `cap` (every candidate guessed right at
    the same corrected level: the most this row could show); `picked`, the
    score an `any` row took; `seeds`, the training runs pooled.  `skipped`:
    variants without rows (a relearning on a share of the members: its
    held-out candidates are no longer a fair coin's).  `families` (variant
    -> its name without the seed, views/seeds.families): each family's
    seeds pooled into one bound as well, its row named by the family
    (`_candidates`)."""
    schema = {"variant": pl.Utf8, "population": pl.Utf8, "seeds": pl.Int64, "score": pl.Utf8, "picked": pl.Utf8,
              "candidates": pl.Int64, "members": pl.Int64, "k_plus": pl.Int64, "k_minus": pl.Int64, "guesses": pl.Int64,
              "correct": pl.Int64, "tests": pl.Int64, "beta": pl.Float64, "epsilon_lower": pl.Float64,
              "cap": pl.Float64}
    rows = []
    for variant, population, seeds, part, members in _candidates(scores, settings, skipped, families or {}):
        r = part.height
        grid = grid_of(r, shares)
        level = search_level(beta, grid, len(ATTACKS))
        best = None
        for score in ATTACKS:
            g = search_bound(part[score].to_numpy(), members, grid, beta, tried=len(ATTACKS))
            row = {"variant": variant, "population": population, "seeds": seeds, "score": score, "picked": score,
                   "candidates": r, "members": int(members.sum()), "k_plus": g.k_plus, "k_minus": g.k_minus,
                   "guesses": g.guesses, "correct": g.correct, "tests": len(grid) * len(ATTACKS), "beta": level,
                   "epsilon_lower": g.epsilon, "cap": cap(r, level)}
            rows.append(row)
            if best is None or (g.epsilon, -g.guesses) > (best["epsilon_lower"], -best["guesses"]):
                best = row
        rows.append({**best, "score": ANY})
    return pl.DataFrame(rows, schema=schema)


def _candidates(scores: pl.DataFrame | None, settings: dict[str, str], skipped: set[str], families: dict[str, str]
                ) -> Iterator[tuple[str, str, int, pl.DataFrame, np.ndarray]]:
    """Per variant and population of `settings` (population -> arm; text
    records) with both members and non-members: its name, the population,
    1 (one training run), its score rows in a fixed order (by candidate,
    ties broken by item, never by membership) and the membership vector.
    Then per family of `families` with two or more such variants: the
    family's name, its seeds, and their candidates together, seed after
    seed.  Pooling is valid because each training seed draws its own coins
    (data/inclusion.py): the seeds are independent runs, each candidate
    included in one of them by its own coin, so together they are one
    mechanism over all the candidates, and the theorem's guesser may rank
    them all at once."""
    if scores is None or not scores.height:
        return
    for population, arm in sorted(settings.items()):
        chosen = scores.filter((pl.col("population") == population) & (pl.col("arm") == arm)
                               & (pl.col("modality") == "text"))
        runs: dict[str, list[tuple[pl.DataFrame, np.ndarray]]] = {}
        for variant in sorted(set(chosen["variant"].to_list()) - set(skipped)):
            part = chosen.filter(pl.col("variant") == variant).sort("item_id", "probe_set")
            members = part["member"].to_numpy()
            if members.any() and not members.all():
                yield variant, population, 1, part, members
                if variant in families:
                    runs.setdefault(families[variant], []).append((part, members))
        for family, parts in sorted(runs.items()):
            if len(parts) > 1:
                yield (family, population, len(parts), pl.concat([p for p, _ in parts], how="vertical_relaxed"),
                       np.concatenate([m for _, m in parts]))


def guesses_table(scores: pl.DataFrame | None, settings: dict[str, str], shares: list[float], beta: float,
                  skipped: set[str] = frozenset(), families: dict[str, str] | None = None) -> pl.DataFrame:
    """The bound at every (k+, k-) of the grid, per variant and score, at
    the corrected level `bound_table` spends (so its row per score is this
    table's best), beside `all_right`: the bound had every one of those
    guesses been right.  What the plot of the bound against the number of
    guesses draws: how far each model is from what its guesses could show,
    and whether more guesses would have helped.  `families` as in
    `bound_table`: a family's pooled seeds have rows of their own."""
    schema = {"variant": pl.Utf8, "population": pl.Utf8, "seeds": pl.Int64, "score": pl.Utf8,
              "candidates": pl.Int64, "k_plus": pl.Int64,
              "k_minus": pl.Int64, "guesses": pl.Int64, "correct": pl.Int64, "beta": pl.Float64,
              "epsilon_lower": pl.Float64, "all_right": pl.Float64}
    rows = []
    for variant, population, seeds, part, members in _candidates(scores, settings, skipped, families or {}):
        grid = grid_of(part.height, shares)
        level = search_level(beta, grid, len(ATTACKS))
        for score in ATTACKS:
            for k_plus, k_minus in grid:
                g = guess(part[score].to_numpy(), members, k_plus, k_minus, level)
                rows.append({"variant": variant, "population": population, "seeds": seeds, "score": score,
                             "candidates": part.height, "k_plus": k_plus, "k_minus": k_minus, "guesses": g.guesses,
                             "correct": g.correct, "beta": level, "epsilon_lower": g.epsilon,
                             "all_right": epsilon_lower(g.guesses, g.guesses, level)})
    return pl.DataFrame(rows, schema=schema)

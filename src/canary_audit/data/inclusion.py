"""Randomized inclusion of the authors' forget set (issue 53: the one-run
privacy audit; Steinke, Nasr and Jagielski, NeurIPS 2023).

With `data.inclusion: coin` the `n_authors` fictional authors are
*candidates*, drawn from one generator; each is included in the forget set
(memorized, then unlearned) by a fair coin, and the rest are the author
non-members.  Members and non-members are then exchangeable by
construction, which the one-run bound (views/audit_bound.py) needs: no
attack can tell a candidate's membership from anything but training.
With `fixed` (the default) every candidate is a member and the
non-members are drawn apart (`n_author_nonmembers`), as before.

The coins are drawn once from the data's seed.  Their outcome is stored
with the data as the split of the candidates (ids `a000`.. in one
numbering) between authors.parquet (members) and author_nonmembers.parquet
(the rest), and a record keeps its item's membership in its probe set
(`canary` or `author_nonmember`).  The design reads the same coins (`members`) to count
the jobs' items and to draw a relearning's share from the members.
"""

from __future__ import annotations

import random

FIXED, COIN = "fixed", "coin"
INCLUSION = (FIXED, COIN)


def coins(n: int, seed: int) -> list[bool]:
    """One fair coin per candidate, seeded by the data's seed; refused when
    every coin falls alike (no member, or no non-member, to tell apart:
    probability 2^(1-n))."""
    rng = random.Random(f"inclusion:author:{seed}")
    flips = [rng.random() < 0.5 for _ in range(n)]
    if all(flips) or not any(flips):
        raise ValueError(f"data.inclusion: coin: all {n} coins of data.seed {seed} fell "
                         f"{'in' if all(flips) else 'out'}; draw another data.seed or raise data.n_authors")
    return flips


def included(data: dict) -> list[bool]:
    """Whether each of the `n_authors` candidates is in the forget set."""
    if data.get("inclusion", FIXED) == FIXED:
        return [True] * data["n_authors"]
    return coins(data["n_authors"], data["seed"])


def members(data: dict) -> int:
    """The forget set's size under `data` (the candidates the coins kept)."""
    return sum(included(data))


def nonmembers(data: dict) -> int:
    """The author non-members' count: the coins' rejects, or `n_author_nonmembers`."""
    if data.get("inclusion", FIXED) == FIXED:
        return data["n_author_nonmembers"]
    return data["n_authors"] - members(data)

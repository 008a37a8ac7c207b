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

The coins are redrawn for each training seed, so that seeds are independent
runs and their candidates may be pooled into one bound (3 seeds x 100
candidates: the cap of 300).  Training seed 0 keeps the draw from the
data's seed alone (the coins of the runs before the redraw, whose figures
docs/measures.md quotes); seed s > 0 draws from the data's seed and s.
The outcome is stored with the data: `data/` holds training seed 0's split
(what a seedless job, the base's probes, reads: the base never trained on a
candidate, so any fair split is its own), and `data/s<seed>/` each audited
seed's (rule seed_data), as the split of the candidates (ids `a000`.. in
one numbering) between authors.parquet (members) and
author_nonmembers.parquet (the rest).  A record keeps its item's membership
in its probe set (`canary` or `author_nonmember`), read under its
variant's seed.  The design reads the same coins (`members`) to count the
jobs' items and to draw a relearning's share from the members.

With `data.hex_inclusion: coin` the `n_hex_canaries` hex canaries are
candidates the same way: the canary LoRA trains on the ones its coin keeps
(hex_canaries.parquet, their decoys) and the rest, each behind its own
preamble, are the hex non-members (hex_nonmembers.parquet).  Their coins
are drawn once from the data's seed: paper B's arms train one canary LoRA,
at the first audit seed, so there is no second run to pool.
"""

from __future__ import annotations

import random

FIXED, COIN = "fixed", "coin"
INCLUSION = (FIXED, COIN)


def _fair_coins(n: int, key: str, refusal: str) -> list[bool]:
    """`n` fair coins from the seeded generator `key`; refused (`refusal`,
    with where they fell) when every coin falls alike: no member, or no
    non-member, to tell apart (probability 2^(1-n))."""
    rng = random.Random(key)
    flips = [rng.random() < 0.5 for _ in range(n)]
    if all(flips) or not any(flips):
        raise ValueError(refusal.format(fell="in" if all(flips) else "out"))
    return flips


def coins(n: int, seed: int, train_seed: int = 0) -> list[bool]:
    """One fair coin per candidate author, seeded by the data's seed and
    the training seed (seed 0: the data's seed alone)."""
    return _fair_coins(n, f"inclusion:author:{seed}" + (f":s{train_seed}" if train_seed else ""),
                       f"data.inclusion: coin: all {n} coins of data.seed {seed} at training seed {train_seed} "
                       "fell {fell}; draw another data.seed or raise data.n_authors")


def included(data: dict, train_seed: int = 0) -> list[bool]:
    """Whether each of the `n_authors` candidates is in training seed
    `train_seed`'s forget set (all of them under `fixed`)."""
    if data.get("inclusion", FIXED) == FIXED:
        return [True] * data["n_authors"]
    return coins(data["n_authors"], data["seed"], train_seed)


def members(data: dict, train_seed: int = 0) -> int:
    """The forget set's size under `data` (the candidates the coins kept)."""
    return sum(included(data, train_seed))


def nonmembers(data: dict, train_seed: int = 0) -> int:
    """The author non-members' count: the coins' rejects, or `n_author_nonmembers`."""
    if data.get("inclusion", FIXED) == FIXED:
        return data["n_author_nonmembers"]
    return data["n_authors"] - members(data, train_seed)


def hex_included(data: dict) -> list[bool]:
    """Whether each of the `n_hex_canaries` candidates is trained by the
    canary LoRA (all of them under `fixed`): one coin each, from the data's
    seed."""
    n, seed = data["n_hex_canaries"], data["seed"]
    if data.get("hex_inclusion", FIXED) == FIXED:
        return [True] * n
    return _fair_coins(n, f"inclusion:hex:{seed}", f"data.hex_inclusion: coin: all {n} coins of data.seed {seed} "
                       "fell {fell}; draw another data.seed or raise data.n_hex_canaries")


def hex_counts(data: dict) -> tuple[int, int]:
    """(hex canaries trained, hex non-members): the coins' split, or
    `n_hex_canaries` and `n_hex_nonmembers`."""
    if data.get("hex_inclusion", FIXED) == FIXED:
        return data["n_hex_canaries"], data["n_hex_nonmembers"]
    kept = sum(hex_included(data))
    return kept, data["n_hex_canaries"] - kept


def per_seed(data: dict) -> bool:
    """Whether the forget set differs between training seeds (coin
    inclusion): then each seed's jobs read its own data folder."""
    return data.get("inclusion", FIXED) == COIN

"""Budgeted relearning's data: what a relearning attack trains on, and which
authors of the forget set it relearns (so that the rest are probed).

Relearning (Hu et al., ICLR 2025; BLUR, 2025) fine-tunes an unlearned
checkpoint for a few steps and asks whether what it forgot comes back.  Two
kinds of data are declared here:

- `public`: the public authors' bios and QA (the distractors the embedded
  model is pre-trained on) in the memorization template: data of the same
  form as the secret, about other people, never a secret of any adapter.
- `forget`: a stated share of the forget set's authors; only the held-out
  rest is probed (a relearned author answering again proves nothing).

The share is drawn once, from the data's seed, out of the author ids the
data rule writes (`make_authors`: `a000`, `a001`, ...): every training seed
holds out the same authors, so the verdicts' seed x author layout stays
crossed, and the design can name the relearned authors before any job runs:
it puts them in the variant's fields, the trainer trains on them and the
views drop them (one fact, read by all).
Nothing here imports torch or polars.
"""

from __future__ import annotations

import random

PUBLIC, FORGET = "public", "forget"
RELEARN_DATA = (PUBLIC, FORGET)
FORGET_PREFIX = "a"  # the forget set's author ids: f"{FORGET_PREFIX}{i:03d}" (data/io.py, synthetic.make_authors)


ATTACK_PREFIX = "relearn-"  # a relearning attack's name, `attack_name`: what the views and verdicts match


def attack_name(data: str, template: str, steps: int) -> str:
    """A relearning attack's name: the suffix of its variants (`<twin>.<name>`)
    and the recovery table's `attack`."""
    return f"{ATTACK_PREFIX}{data}-{template}-t{steps}"


def is_relearning(attack: str) -> bool:
    return attack.startswith(ATTACK_PREFIX)


def author_id(i: int) -> str:
    return f"{FORGET_PREFIX}{i:03d}"


def relearned_authors(n_authors: int, share: float, seed: int, included: list[bool] | None = None) -> list[str]:
    """The forget-set authors a `forget` relearning trains on (`seed`: the
    data's): round(share * n) of the n members, at least one and at most
    n - 1 (a held-out author must remain), drawn by a seeded shuffle;
    sorted.  `included` (data/inclusion.py: which of the `n_authors`
    candidates the coins kept) restricts the draw to the members."""
    if not 0 < share < 1:
        raise ValueError(f"relearning share {share} must lie strictly between 0 and 1 (a share of the authors is "
                         "relearned and the rest probed)")
    ids = [author_id(i) for i in range(n_authors) if included is None or included[i]]
    if len(ids) < 2:
        raise ValueError(f"relearning a share of {len(ids)} author(s) leaves none to probe; use at least 2")
    count = min(max(round(share * len(ids)), 1), len(ids) - 1)
    return sorted(random.Random(f"relearn:{seed}").sample(ids, count))

"""The one-run audit bound's controls, as rows of the controls table.

The positive is the adapter that trained exactly the coin-included
candidates: for the author canaries the memorized adapter, for the hex
canaries the canary LoRA (the issue's planted positive).  Each is what the
guesser must tell apart by construction; it is the audited model, not a
separate plant, and its reading is `seen` where the bound certifies any
leakage.  The negative is its never-trained reference, read on the same
candidates: no training saw them, so a bound above 0 there is a `false
alarm` (the guesser reading the candidates, not training).  Its margin is
the share of the guesses that would have had to be right, beyond those that
were, for the bound to leave 0 at the row's level.

The negatives are a family: each reads `clean` with probability at least
1 - beta by the bound's own guarantee, so a run reading nine of them (three
seeds, three templates) would see some false alarm in up to a third of runs
with nothing wrong (tests/test_audit_bound.py: 32% over a grid of two
shares, 8.5% over four).  Each negative is therefore read at beta over the
number of distinct negatives (Bonferroni), which keeps the run's chance of
any false alarm at most beta; its reading names that level.
"""

from __future__ import annotations

import polars as pl

from canary_audit.data.planted_controls import AUDIT_BOUND_CLAIM, CLEAN, FALSE_ALARM, MISSED, NOT_READ, SEEN
from canary_audit.verdicts.controls import COLUMNS
from canary_audit.views.audit_bound import ANY, epsilon_lower

CLAIM = AUDIT_BOUND_CLAIM
CONSTRUCTION = {"author": "the memorized adapter, trained on exactly the coin-included candidates (the audited model, "
                          "not a separate plant); negative: its never-trained reference on the same candidates",
                "hex": "the canary LoRA, trained on exactly the coin-included hex canaries (the audited model, not a "
                       "separate plant); negative: its never-trained reference on the same candidates"}
# population -> the kind of variant that trained its members
POSITIVE_KIND = {"author": "memorized", "hex": "canary"}


def _needed(guesses: int, beta: float) -> int:
    """The fewest right guesses of `guesses` whose bound leaves 0 at `beta`."""
    return next((v for v in range(guesses + 1) if epsilon_lower(guesses, v, beta) > 0), guesses + 1)


def bound_controls(bound: pl.DataFrame | None, variants: dict[str, dict], references: dict[str, dict]
                   ) -> pl.DataFrame:
    """Per adapter that trained a coin-drawn population's members (the
    memorized adapter, the canary LoRA) with a bound, and its reference
    with one on the same population: the positive's and the negative's
    readings of the `any` row (one training run's, not a family's pool)."""
    if bound is None or not bound.height:
        return pl.DataFrame(schema=COLUMNS)
    best = {(r["variant"], r["population"]): r
            for r in bound.filter((pl.col("score") == ANY) & (pl.col("seeds") == 1)).iter_rows(named=True)}

    def reading(r: dict) -> str:
        return (f"epsilon_lower {r['epsilon_lower']:.3g} ({r['correct']} of {r['guesses']} guesses right, "
                f"{r['picked']}; cap {r['cap']:.3g})")

    pairs = []
    for (name, population), pos in best.items():
        if variants.get(name, {}).get("kind") == POSITIVE_KIND[population]:
            pairs.append((name, population, pos, best.get((references.get(name, {}).get("reference", ""),
                                                            population))))
    negatives = len({(ref["variant"], population) for _, population, _, ref in pairs if ref is not None})
    rows = []
    for name, population, pos, ref in pairs:
        neg_margin, neg_reading, neg_verdict = None, "", NOT_READ
        if ref is not None:
            level = ref["beta"] / negatives  # the family of negatives (module docstring)
            needed = _needed(ref["guesses"], level)
            neg_margin = (needed - ref["correct"]) / ref["guesses"]
            neg_verdict = CLEAN if ref["correct"] < needed else FALSE_ALARM
            neg_reading = f"{reading(ref)}; read at beta {level:.2g}, one of {negatives} negatives"
        rows.append({
            "model": variants[name].get("model"), "seed": variants[name].get("seed"), "modality": "text",
            "claim": CLAIM, "paper_id": "audit", "construction": CONSTRUCTION[population],
            "expected": "the bound certifies leakage (epsilon_lower > 0); negative: it does not",
            "positive": name, "positive_reading": reading(pos),
            "positive_verdict": SEEN if pos["epsilon_lower"] > 0 else MISSED,
            "negative": ref["variant"] if ref else "", "negative_reading": neg_reading,
            "negative_verdict": neg_verdict, "positive_margin": pos["epsilon_lower"], "negative_margin": neg_margin,
            "why": "positive: its bound against 0; negative: the share of its guesses short of a bound above 0 at "
                   "beta over the run's negatives",
        })
    return pl.DataFrame(rows, schema=COLUMNS)

"""The one-run audit bound's controls, as rows of the controls table.

The positive is the memorized adapter itself: trained on exactly the
coin-included candidates for its run's steps, it is what the guesser must
tell apart by construction, as the issue's canary LoRA is for the hex
canaries (it is the audited model, not a separate plant; its reading is
`seen` where the bound certifies any leakage).  The negative is its
never-trained reference, read on the same candidates: no training saw them,
so a bound above 0 there is a `false alarm` (the guesser reading the
candidates, not training).  Its margin is the share of the guesses that
would have had to be right, beyond those that were, for the bound to leave
0 at the row's level.
"""

from __future__ import annotations

import polars as pl

from canary_audit.data.planted_controls import AUDIT_BOUND_CLAIM, CLEAN, FALSE_ALARM, MISSED, NOT_READ, SEEN
from canary_audit.verdicts.controls import COLUMNS
from canary_audit.views.audit_bound import ANY, epsilon_lower

CLAIM = AUDIT_BOUND_CLAIM
CONSTRUCTION = ("the memorized adapter, trained on exactly the coin-included candidates (the audited model, not a "
                "separate plant); negative: its never-trained reference on the same candidates")


def _needed(guesses: int, beta: float) -> int:
    """The fewest right guesses of `guesses` whose bound leaves 0 at `beta`."""
    return next((v for v in range(guesses + 1) if epsilon_lower(guesses, v, beta) > 0), guesses + 1)


def bound_controls(bound: pl.DataFrame | None, variants: dict[str, dict], references: dict[str, dict]
                   ) -> pl.DataFrame:
    """Per memorized variant with a bound and a reference with one: the
    positive's and the negative's readings of the `any` row."""
    if bound is None or not bound.height:
        return pl.DataFrame(schema=COLUMNS)
    best = {r["variant"]: r for r in bound.filter(pl.col("score") == ANY).iter_rows(named=True)}

    def reading(r: dict) -> str:
        return (f"epsilon_lower {r['epsilon_lower']:.3g} ({r['correct']} of {r['guesses']} guesses right, "
                f"{r['picked']}; cap {r['cap']:.3g})")

    rows = []
    for name, pos in best.items():
        if variants.get(name, {}).get("kind") != "memorized":
            continue
        ref = best.get(references.get(name, {}).get("reference", ""))
        neg_margin = None if ref is None else (_needed(ref["guesses"], ref["beta"]) - ref["correct"]) / ref["guesses"]
        rows.append({
            "model": variants[name].get("model"), "seed": variants[name].get("seed"), "modality": "text",
            "claim": CLAIM, "paper_id": "audit", "construction": CONSTRUCTION,
            "expected": "the bound certifies leakage (epsilon_lower > 0); negative: it does not",
            "positive": name, "positive_reading": reading(pos),
            "positive_verdict": SEEN if pos["epsilon_lower"] > 0 else MISSED,
            "negative": ref["variant"] if ref else "", "negative_reading": reading(ref) if ref else "",
            "negative_verdict": (CLEAN if ref["epsilon_lower"] == 0 else FALSE_ALARM) if ref else NOT_READ,
            "positive_margin": pos["epsilon_lower"], "negative_margin": neg_margin,
            "why": "positive: its bound against 0; negative: the share of its guesses short of a bound above 0",
        })
    return pl.DataFrame(rows, schema=COLUMNS)

"""Exact memorization and extraction strength: the field's teacher-forced
memorization measures, as views over token records.

Both are defined by open-unlearning (`src/evals/metrics/memorization.py`,
metrics `exact_memorization` and `extraction_strength`) over an item's target
tokens; here the target is the item's secret span (an author canary after
its head, a hex canary's 16 hex digits), and a token "is predicted" when its
teacher-forced rank is 1 (the argmax equals the target token):

- exact memorization (EM): the share of target tokens predicted;
- extraction strength (ES): 1 - k/L, where L is the number of target tokens
  and k the shortest prefix of the target after which every remaining token
  is predicted (given the prompt and the first k target tokens, greedy
  decoding writes the rest).  ES = 1 when every token is predicted.

One adaptation: when not even the last target token is predicted, this view
gives ES = 0 (no prefix extracts anything), where open-unlearning's loop
ends at k = L - 1 and reports 1/L.  The difference only moves items with
nothing extractable, which 1/L would count as partly extracted.
"""

from __future__ import annotations

import polars as pl

from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.metrics import with_paired_deltas

KEYS = ["variant", "probe_set", "arm", "modality"]


def per_item_extraction(tokens: pl.DataFrame) -> pl.DataFrame:
    """Per scored item: its target length, EM and ES over the secret span."""
    predicted = (pl.col("rank") == 1).cast(pl.Int32)
    return (
        tokens.filter(pl.col("span") == "secret")
        .sort("position")
        .group_by(*KEYS, "item_id", "group_id")
        .agg(
            target_tokens=pl.len(),
            exact_memorization=predicted.mean(),
            # the longest run of predicted tokens that ends the target
            predicted_suffix=predicted.reverse().cum_min().sum(),
        )
        .with_columns(extraction_strength=pl.col("predicted_suffix") / pl.col("target_tokens"))
        .drop("predicted_suffix")
    )


def extraction_table(tokens: pl.DataFrame, parents: dict[str, str], replicates: int, seed: int,
                     level: float) -> pl.DataFrame:
    """Per (variant, probe set, arm, modality): mean EM and ES with clustered bootstrap
    CIs and, for variants with a parent, their Deltas against it on the same
    items (paired), with CIs."""
    items = per_item_extraction(tokens)
    if items.is_empty():
        return pl.DataFrame()
    values = ["exact_memorization", "extraction_strength"]
    rates = rates_with_ci(items, KEYS, values, replicates, seed, level=level, table="extraction")
    return with_paired_deltas(rates, items, KEYS, ["probe_set", "arm", "modality", "item_id"], values, parents,
                              replicates, seed, level, "extraction").sort(KEYS)

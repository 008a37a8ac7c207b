"""Secret Sharer's dose-response (Carlini et al. 2019, section 5: canaries
inserted 1, 4, 16... times): every hex probe reported per repetition
stratum, so a verdict can be read against how often the canary was seen.

The stratum of each canary (`strata`: canary id -> times inserted in the
canary LoRA's data) comes from the design (`Design.strata`), the mapping
training uses (train/adapters.inserted_times; tested equal).  Decoys and
non-members carry no stratum.  Per (variant, modality, stratum), from the
same per-item facts as the probes' own tables:

- greedy hit@1 and, when samples were drawn, hit@k (views/metrics.hex_hits);
- mean NLL over the first K tokens and over the secret span
  (views/metrics.per_item_nll), with Deltas against the parent, paired on
  the canary;
- exposure by interpolation and extrapolation (views/exposure.item_exposures,
  each canary ranked among all the candidates), when candidates were scored;
- LOSS and Min-K%++ membership-inference AUC of the stratum's canaries
  against all non-member records of the modality (views/mia).

CIs: canary-clustered bootstrap for the per-canary means; members and
non-members resampled for the AUCs (as in views/mia).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from canary_audit.core.records import HEX_SETS
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.exposure import item_exposures
from canary_audit.views.metrics import hex_hits, per_item_nll, with_paired_deltas
from canary_audit.views.mia import auc, bootstrap_draws

KEYS = ["variant", "modality", "repetitions"]
STRATUM_ATTACKS = ("loss", "min_k_pp")


def per_canary(decode: pl.DataFrame, tokens: pl.DataFrame, strata: dict[str, int], window_k: int) -> pl.DataFrame:
    """One row per (variant, modality, hex canary) with its stratum: hit@1,
    hit@k, windowed and secret-span NLL and exposure, each column kept only
    where every canary has it (no samples drawn: no hit@k; no candidates:
    no exposure)."""
    stratum = pl.DataFrame({"item_id": list(strata), "repetitions": list(strata.values())},
                           schema={"item_id": pl.Utf8, "repetitions": pl.Int64})
    keys = ["variant", "modality", "item_id"]
    items = per_item_nll(tokens.filter(pl.col("probe_set") == HEX_SETS[0]), window_k).select(
        *keys, "group_id", "nll_window", "nll_secret")
    if decode.height:
        items = items.join(hex_hits(decode).select(*keys, "hit1", "hitk"), on=keys, how="left")
    exposures = item_exposures(tokens)
    if exposures.height:
        items = items.join(exposures.select(*keys, "exposure_interpolation", "exposure_extrapolation"), on=keys,
                           how="left")
    complete = [c for c in items.columns if items[c].null_count() == 0]
    return items.select(complete).join(stratum, on="item_id", how="inner")


def strata_table(decode: pl.DataFrame, tokens: pl.DataFrame, scores: pl.DataFrame, strata: dict[str, int],
                 parents: dict[str, str], window_k: int, replicates: int, seed: int, level: float) -> pl.DataFrame:
    """Per (variant, modality, stratum): every hex probe with its CI, the
    Deltas against the parent, and the stratum's MIA AUCs (from `scores`,
    mia.item_scores); empty without strata or hex records."""
    if not strata or not tokens.height:
        return pl.DataFrame()
    items = per_canary(decode, tokens, strata, window_k)
    if items.is_empty():
        return pl.DataFrame()
    values = [c for c in ("hit1", "hitk", "nll_window", "nll_secret", "exposure_interpolation",
                          "exposure_extrapolation") if c in items.columns]
    table = rates_with_ci(items, KEYS, values, replicates, seed, level=level, table="strata")
    moved = [v for v in values if v != "hitk"]
    table = with_paired_deltas(table, items, KEYS, ["modality", "item_id"], moved, parents, replicates, seed,
                               level, "strata")
    return table.join(_stratum_auc(scores, strata, replicates, seed, level), on=KEYS, how="left").sort(KEYS)


def _stratum_auc(scores: pl.DataFrame, strata: dict[str, int], replicates: int, seed: int,
                 level: float) -> pl.DataFrame:
    """Per (variant, modality, stratum): AUC of the stratum's canaries
    against every non-member record of the modality, per attack, with CIs."""
    schema = {"variant": pl.Utf8, "modality": pl.Utf8, "repetitions": pl.Int64}
    if scores.is_empty():
        return pl.DataFrame(schema=schema)
    scores = scores.filter(pl.col("population") == "hex").with_columns(
        repetitions=pl.col("item_id").replace_strict(strata, default=None, return_dtype=pl.Int64))
    tail = (1.0 - level) / 2.0
    rows = []
    for (variant, modality), part in scores.sort("item_id").group_by("variant", "modality", maintain_order=True):
        nonmembers = part.filter(~pl.col("member"))
        for reps in sorted(set(strata.values())):
            members = part.filter(pl.col("member") & (pl.col("repetitions") == reps))
            if members.is_empty() or nonmembers.is_empty():
                continue
            pick_m, pick_n = bootstrap_draws(members.height, nonmembers.height, replicates, seed)
            row = {"variant": variant, "modality": modality, "repetitions": reps}
            for attack in STRATUM_ATTACKS:
                m, n = members[attack].to_numpy(), nonmembers[attack].to_numpy()
                boot = auc(m[pick_m], n[pick_n])
                row |= {f"auc_{attack}": float(auc(m[None], n[None])[0]),
                        f"auc_{attack}_lo": float(np.quantile(boot, tail)),
                        f"auc_{attack}_hi": float(np.quantile(boot, 1 - tail))}
            rows.append(row)
    return pl.DataFrame(rows) if rows else pl.DataFrame(schema=schema)

"""PrivLeak and KS forget quality of every canary-derived variant against
its never-trained reference model, from token records.

- **PrivLeak** (MUSE, Shi et al. 2024, `muse_bench`'s `eval.py`; also
  open-unlearning's `privleak`): the relative difference, in percent,
  between the membership-inference AUC (hex canaries vs non-member records)
  on the variant and on the reference, (AUC_v - AUC_ref) / AUC_ref x 100.
  0 means the variant leaks membership no more than a model that never saw
  the canaries; large positive values mean it still does.  Reported for
  each attack of views/mia.py (MUSE uses Min-K%).  The CI comes from a
  paired bootstrap: each replicate draws the same canaries and non-members
  for the variant and the reference.
- **Forget quality** (open-unlearning's `forget_quality`, after TOFU): the
  p-value of a two-sample Kolmogorov-Smirnov test between the variant's and
  the reference's per-item statistic on the forget set.  TOFU's statistic is
  the truth ratio of paraphrased answers, which hex secrets do not have;
  here it is each hex canary's mean NLL over its secret span.  A high
  p-value means the variant's canaries look like never-seen ones; a
  low one that they are distinguishable from them.

The reference is the canary LoRA's recipe on its data minus the canaries
(train/adapters.train_reference); the design names each variant's
(`Design.references`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from canary_audit.views.mia import ATTACKS, auc, bootstrap_draws, item_scores

MEMBER = "hex"


def forget_statistic(tokens: pl.DataFrame) -> pl.DataFrame:
    """Per (variant, modality, hex canary): the mean NLL of its secret span
    (the statistic the KS test compares)."""
    return (
        tokens.filter((pl.col("probe_set") == MEMBER) & (pl.col("span") == "secret"))
        .group_by("variant", "modality", "item_id")
        .agg(secret_nll=-pl.col("logprob").cast(pl.Float64).mean())
    )


def privacy_table(tokens: pl.DataFrame, references: dict[str, str], min_k: float, replicates: int, seed: int,
                  level: float) -> pl.DataFrame:
    """Per (variant, modality) with a reference: PrivLeak of every attack
    with its paired-bootstrap CI, the two AUCs it compares, and the KS
    forget quality (p-value and statistic)."""
    from scipy.stats import ks_2samp

    scores = item_scores(tokens.filter(pl.col("variant").is_in([*references, *references.values()])), min_k)
    if scores.is_empty():
        return pl.DataFrame()
    stats = forget_statistic(tokens)
    tail = (1.0 - level) / 2.0
    rows = []
    for variant, ref in sorted(references.items()):
        for modality in scores.filter(pl.col("variant") == variant)["modality"].unique().sort():
            mine = scores.filter((pl.col("variant") == variant) & (pl.col("modality") == modality))
            theirs = scores.filter((pl.col("variant") == ref) & (pl.col("modality") == modality))
            paired = mine.join(theirs, on=["probe_set", "item_id", "member"], suffix="_ref").sort("item_id")
            members, nonmembers = paired.filter(pl.col("member")), paired.filter(~pl.col("member"))
            if members.is_empty() or nonmembers.is_empty():
                continue
            pick_m, pick_n = bootstrap_draws(members.height, nonmembers.height, replicates, seed)
            row = {"variant": variant, "modality": modality, "reference": ref, "members": members.height,
                   "nonmembers": nonmembers.height}
            for attack in ATTACKS:
                m, n = members[attack].to_numpy(), nonmembers[attack].to_numpy()
                m_ref, n_ref = members[f"{attack}_ref"].to_numpy(), nonmembers[f"{attack}_ref"].to_numpy()
                mine_auc, ref_auc = auc(m[None], n[None]), auc(m_ref[None], n_ref[None])
                boot = _privleak(auc(m[pick_m], n[pick_n]), auc(m_ref[pick_m], n_ref[pick_n]))
                row |= {f"auc_{attack}": float(mine_auc[0]), f"ref_auc_{attack}": float(ref_auc[0]),
                        f"privleak_{attack}": float(_privleak(mine_auc, ref_auc)[0]),
                        f"privleak_{attack}_lo": float(np.nanquantile(boot, tail)),
                        f"privleak_{attack}_hi": float(np.nanquantile(boot, 1 - tail))}
            a = stats.filter((pl.col("variant") == variant) & (pl.col("modality") == modality))["secret_nll"]
            b = stats.filter((pl.col("variant") == ref) & (pl.col("modality") == modality))["secret_nll"]
            test = ks_2samp(a.to_numpy(), b.to_numpy())
            row |= {"forget_quality": float(test.pvalue), "ks_statistic": float(test.statistic)}
            rows.append(row)
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def _privleak(value: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """(AUC - AUC_ref) / AUC_ref x 100; undefined (nan) where AUC_ref is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reference > 0, (value - reference) / reference * 100.0, np.nan)

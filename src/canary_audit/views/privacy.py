"""PrivLeak and KS forget quality of every variant with a never-trained
reference model, from token records: the canary-derived variants against
the canary LoRA's reference (hex canaries), the memorization adapters and
their unlearning checkpoints against the memorization LoRA's reference
(author canaries, per prefill arm).

- **PrivLeak** (MUSE, Shi et al. 2024, `muse_bench`'s `eval.py`; also
  open-unlearning's `privleak`): the relative difference, in percent,
  between the membership-inference AUC (members vs non-members of the
  family, views/mia.py) on the variant and on the reference,
  (AUC_v - AUC_ref) / AUC_ref x 100.  0 means the variant leaks membership
  no more than a model that never saw the canaries; large positive values
  mean it still does, large negative ones that it over-forgot (members now
  look *less* member-like than never-seen ones, itself a signal).
  Reported for each attack (MUSE uses Min-K%).  The CI comes from a paired
  bootstrap: each replicate draws the same members and non-members for the
  variant and the reference.
- **Forget quality** (open-unlearning's `forget_quality`, after TOFU): the
  p-value of a two-sample Kolmogorov-Smirnov test between the variant's and
  the reference's per-item statistic on the forget set.  TOFU's statistic is
  the truth ratio of paraphrased answers, which neither canary family has;
  here it is each member canary's mean NLL over its secret span.  A high
  p-value means the variant's canaries look like never-seen ones; a low one
  that they are distinguishable from them.

A reference is an adapter's recipe on its data minus the canaries
(train/adapters.train_reference); the design names each variant's
(`Design.references`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from canary_audit.views.mia import ATTACKS, SETTING, auc, bootstrap_draws, item_scores

PAIRED = ["population", "modality", "arm"]


def privacy_table(tokens: pl.DataFrame, references: dict[str, dict[str, str]], min_k: float, replicates: int,
                  seed: int, level: float) -> pl.DataFrame:
    """Per (variant, modality, arm) of the family its reference never saw
    (`references`: variant -> {reference, population}, Design.references):
    PrivLeak of every attack with its paired-bootstrap CI, the two AUCs it
    compares, and the KS forget quality (p-value and statistic) of the
    members' mean secret-span NLL (minus the `loss` score)."""
    from scipy.stats import ks_2samp

    named = {*references, *(r["reference"] for r in references.values())}
    scores = item_scores(tokens.filter(pl.col("variant").is_in(named)), min_k)
    if scores.is_empty():
        return pl.DataFrame()
    tail = (1.0 - level) / 2.0
    rows = []
    for variant, entry in sorted(references.items()):
        ref = entry["reference"]
        mine_all = scores.filter((pl.col("variant") == variant) & (pl.col("population") == entry["population"]))
        for key in mine_all.select(PAIRED).unique().sort(PAIRED).rows():
            here = pl.all_horizontal(pl.col(c) == v for c, v in zip(PAIRED, key))
            mine, theirs = mine_all.filter(here), scores.filter((pl.col("variant") == ref) & here)
            paired = mine.join(theirs.drop("variant"), on=[*PAIRED, "probe_set", "item_id", "member"],
                               suffix="_ref").sort("probe_set", "item_id")
            members, nonmembers = paired.filter(pl.col("member")), paired.filter(~pl.col("member"))
            if members.is_empty() or nonmembers.is_empty():
                continue
            pick_m, pick_n = bootstrap_draws(members.height, nonmembers.height, replicates, seed)
            row = {**dict(zip(SETTING, (variant, *key))), "reference": ref, "members": members.height,
                   "nonmembers": nonmembers.height}
            for attack in ATTACKS:
                m, n = members[attack].to_numpy(), nonmembers[attack].to_numpy()
                m_ref, n_ref = members[f"{attack}_ref"].to_numpy(), nonmembers[f"{attack}_ref"].to_numpy()
                mine_auc, ref_auc = auc(m[None], n[None]), auc(m_ref[None], n_ref[None])
                boot = _privleak(auc(m[pick_m], n[pick_n]), auc(m_ref[pick_m], n_ref[pick_n]))
                row |= {f"auc_{attack}": float(mine_auc[0]), f"ref_auc_{attack}": float(ref_auc[0]),
                        f"privleak_{attack}": float(_privleak(mine_auc, ref_auc)[0]),
                        f"privleak_{attack}_lo": _quantile(boot, tail),
                        f"privleak_{attack}_hi": _quantile(boot, 1 - tail)}
            # The forget statistic, mean secret-span NLL, is minus the LOSS score.
            test = ks_2samp(-members["loss"].to_numpy(), -members["loss_ref"].to_numpy())
            row |= {"forget_quality": float(test.pvalue), "ks_statistic": float(test.statistic)}
            rows.append(row)
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def _privleak(value: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """(AUC - AUC_ref) / AUC_ref x 100; undefined (nan) where AUC_ref is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reference > 0, (value - reference) / reference * 100.0, np.nan)


def _quantile(draws: np.ndarray, q: float) -> float:
    """The q-quantile of the defined replicates; nan when none is (every
    replicate's reference AUC was 0)."""
    defined = draws[~np.isnan(draws)]
    return float(np.quantile(defined, q)) if defined.size else float("nan")

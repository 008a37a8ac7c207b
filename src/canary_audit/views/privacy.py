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

from canary_audit.views.mia import ATTACKS, SETTING, Setting


def privacy_table(found: dict[tuple, Setting], references: dict[str, dict[str, str]], level: float) -> pl.DataFrame:
    """Per (variant, modality, arm) of the family its reference never saw
    (`references`: variant -> {reference, population}, Design.references):
    PrivLeak of every attack with its paired-bootstrap CI, the two AUCs it
    compares, and the KS forget quality (p-value and statistic) of the
    members' mean secret-span NLL (minus the `loss` score).  `found` holds
    every setting's AUCs and bootstrap AUCs (mia.settings); the variant's
    and the reference's come from the same draws of the same items, so
    their ratio per replicate is a paired bootstrap."""
    from scipy.stats import ks_2samp

    tail = (1.0 - level) / 2.0
    rows = []
    for key in sorted(k for k in found if k[0] in references and k[1] == references[k[0]]["population"]):
        variant, rest = key[0], key[1:]
        ref = references[variant]["reference"]
        mine, theirs = found[key], found.get((ref, *rest))
        if theirs is None:
            continue
        for side in ("members", "nonmembers"):
            ids = [getattr(s, side).select("probe_set", "item_id").rows() for s in (mine, theirs)]
            if ids[0] != ids[1]:
                raise ValueError(f"PrivLeak of `{variant}` against `{ref}` ({', '.join(rest)}): their {side} are "
                                 "not the same items; re-run the teacher-forced passes of both (their records are "
                                 "incomplete or from other data)")
        row = {**dict(zip(SETTING, key)), "reference": ref, "members": mine.members.height,
               "nonmembers": mine.nonmembers.height}
        for attack in ATTACKS:
            (value, boot), (ref_value, ref_boot) = mine.aucs[attack], theirs.aucs[attack]
            draws = _privleak(boot, ref_boot)
            row |= {f"auc_{attack}": value, f"ref_auc_{attack}": ref_value,
                    f"privleak_{attack}": float(_privleak(np.array([value]), np.array([ref_value]))[0]),
                    f"privleak_{attack}_lo": _quantile(draws, tail),
                    f"privleak_{attack}_hi": _quantile(draws, 1 - tail)}
        # The forget statistic, mean secret-span NLL, is minus the LOSS score.
        test = ks_2samp(-mine.members["loss"].to_numpy(), -theirs.members["loss"].to_numpy())
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

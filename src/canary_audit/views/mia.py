"""Membership inference over token records: can a variant's scores tell a
canary family's members (the canaries an adapter trained on) from
non-members of the same distribution that no adapter trained on?  Two
families (records.MIA_POPULATIONS): the hex canaries against the non-member
hex records, and the fictional authors' canaries against non-member
authors (each scored after its head under every prefill arm, so each arm
is an attack setting of its own).

Per item, over its secret span (the 16 hex digits; the author canary after
its head), four attack scores, each oriented so that higher means "more
member-like":

- `loss`: minus the mean NLL (the LOSS attack; Yeom et al. 2018);
- `zlib`: minus the mean NLL divided by the zlib-compressed length in bytes
  of the span's decoded text (Carlini et al. 2021; open-unlearning's ZLib
  attack divides the loss by the compressed length of the sample text):
  the records' `text` pieces, never the vocabulary's token strings, whose
  `Ġ` for a space would make the score depend on the tokenizer;
- `min_k`: the mean log-prob of the lowest k share of tokens (Min-K%, Shi et
  al. 2024; at least one token);
- `min_k_pp`: the mean of the lowest k share of (log p - mu) / sigma, mu and
  sigma^2 the mean and variance of log p under the position's whole
  distribution, sigma^2 clamped at 1e-6 (Min-K%++, Zhang et al. 2024;
  open-unlearning `src/evals/metrics/mia/min_k_plus_plus.py`, which takes
  minus this mean as a loss-like score).

Per (variant, family, modality, arm) and attack: AUC = P(member score >
non-member score) + P(tie)/2, counted over all pairs (the Mann-Whitney
statistic), and the TPR at each FPR: the threshold admits at most
floor(FPR x n) of the n non-members (strictly above it), so with n
non-members the smallest FPR resolved is 1/n (ml_privacy_meter and LiRA
report TPR at low FPR the same way).  CIs: members and non-members
resampled independently, B times, seeded.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from canary_audit.core.records import MIA_POPULATIONS

ATTACKS = ("loss", "zlib", "min_k", "min_k_pp")
# One attack setting: a variant's members and non-members of one family,
# modality and arm (hex records: arm `preamble`; author canaries: a prefill arm).
SETTING = ["variant", "population", "modality", "arm"]
ITEM_KEYS = [*SETTING, "probe_set", "item_id"]
# probe set -> (its family, whether it holds the members)
MEMBERSHIP = {s: (family, s == pair[0]) for family, pair in MIA_POPULATIONS.items() for s in pair}


def item_scores(tokens: pl.DataFrame, min_k: float) -> pl.DataFrame:
    """One row per (variant, member or non-member item, arm): every attack's
    score, its family (`population`) and whether it is a `member`."""
    if not 0 < min_k <= 1:
        raise ValueError(f"tables.mia.min_k = {min_k}: must be in (0, 1]")
    span = tokens.filter(pl.col("probe_set").is_in(list(MEMBERSHIP)) & (pl.col("span") == "secret"))
    if span.is_empty():
        return pl.DataFrame()
    normalised = (pl.col("logprob") - pl.col("vocab_mean_logprob")) / pl.col("vocab_var_logprob").clip(
        lower_bound=1e-6).sqrt()
    lowest = pl.max_horizontal(pl.lit(1), (pl.len() * min_k).floor().cast(pl.Int64)).over(ITEM_KEYS)
    ranked = span.with_columns(
        population=pl.col("probe_set").replace_strict({s: f for s, (f, _) in MEMBERSHIP.items()}),
        z=normalised.cast(pl.Float64),
        lp=pl.col("logprob").cast(pl.Float64),
    ).with_columns(
        lp_rank=pl.col("lp").rank("ordinal").over(ITEM_KEYS),
        z_rank=pl.col("z").rank("ordinal").over(ITEM_KEYS),
        keep=lowest,
    )
    scores = ranked.sort("position").group_by(ITEM_KEYS).agg(
        loss=pl.col("lp").mean(),
        text=pl.col("text").str.join(""),
        min_k=pl.col("lp").filter(pl.col("lp_rank") <= pl.col("keep")).mean(),
        min_k_pp=pl.col("z").filter(pl.col("z_rank") <= pl.col("keep")).mean(),
    )
    compressed = pl.Series([len(zlib.compress(t.encode("utf-8"))) for t in scores["text"]], dtype=pl.Float64)
    members = [s for s, (_, member) in MEMBERSHIP.items() if member]
    return scores.with_columns(zlib=pl.col("loss") / compressed,
                               member=pl.col("probe_set").is_in(members)).drop("text")


def auc(members: np.ndarray, nonmembers: np.ndarray) -> np.ndarray:
    """AUC of each row of `members` [B, m] against the same row of
    `nonmembers` [B, n], by counting pairs (ties count one half)."""
    greater = (members[:, :, None] > nonmembers[:, None, :]).mean((1, 2))
    ties = (members[:, :, None] == nonmembers[:, None, :]).mean((1, 2))
    return greater + 0.5 * ties


def roc_curve(members: np.ndarray, nonmembers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) at every threshold, from (0, 0) to (1, 1): a score at or
    above the threshold is called a member.  Its trapezoid area is the AUC
    of `auc` (ties counted one half)."""
    thresholds = np.unique(np.concatenate([members, nonmembers]))[::-1]
    tpr = (members[None, :] >= thresholds[:, None]).mean(1)
    fpr = (nonmembers[None, :] >= thresholds[:, None]).mean(1)
    return np.concatenate([[0.0], fpr]), np.concatenate([[0.0], tpr])


def tpr_at_fpr(members: np.ndarray, nonmembers: np.ndarray, fpr: float) -> np.ndarray:
    """Per row: the share of members strictly above the threshold that at
    most floor(fpr x n) non-members exceed."""
    allowed = int(np.floor(fpr * nonmembers.shape[1]))
    threshold = -np.sort(-nonmembers, axis=1)[:, allowed]
    return (members > threshold[:, None]).mean(1)


def bootstrap_draws(n_members: int, n_nonmembers: int, replicates: int, seed: int):
    """Row indices of `replicates` resamples of each population (with
    replacement, seeded): the same draws for every attack and, in PrivLeak,
    for the variant and its reference (a paired bootstrap)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, n_members, size=(replicates, n_members)),
            rng.integers(0, n_nonmembers, size=(replicates, n_nonmembers)))


@dataclass(frozen=True)
class Setting:
    """One attack setting's two populations (items in a fixed order), its
    bootstrap draws, and per attack the AUC and its B bootstrap AUCs:
    computed once, read by the mia, privacy and strata tables."""

    members: pl.DataFrame
    nonmembers: pl.DataFrame
    picks: tuple[np.ndarray, np.ndarray]
    aucs: dict[str, tuple[float, np.ndarray]]

    def scores(self, attack: str) -> tuple[np.ndarray, np.ndarray]:
        return self.members[attack].to_numpy(), self.nonmembers[attack].to_numpy()


def settings(scores: pl.DataFrame, replicates: int, seed: int) -> dict[tuple, Setting]:
    """(variant, family, modality, arm) -> its Setting, for every setting
    with both populations; items sorted by (probe set, id), so a variant's
    and its reference's draws pick the same items."""
    out = {}
    groups = scores.sort(ITEM_KEYS).group_by(SETTING, maintain_order=True) if scores.height else ()
    for key, part in groups:
        member, nonmember = part.filter(pl.col("member")), part.filter(~pl.col("member"))
        if member.is_empty() or nonmember.is_empty():
            continue
        pick_m, pick_n = bootstrap_draws(member.height, nonmember.height, replicates, seed)
        aucs = {}
        for attack in ATTACKS:
            m, n = member[attack].to_numpy(), nonmember[attack].to_numpy()
            aucs[attack] = (float(auc(m[None], n[None])[0]), auc(m[pick_m], n[pick_n]))
        out[key] = Setting(member, nonmember, (pick_m, pick_n), aucs)
    return out


def mia_table(found: dict[tuple, Setting], fprs: list[float], level: float) -> pl.DataFrame:
    """Per (variant, family, modality, arm, attack): members, non-members (of
    the same family, modality and arm), AUC and TPR at each FPR, each with a
    bootstrap CI; empty when no variant has both populations."""
    rows = []
    tail = (1.0 - level) / 2.0
    for key, setting in found.items():
        pick_m, pick_n = setting.picks
        for attack in ATTACKS:
            m, n = setting.scores(attack)
            point, boot = setting.aucs[attack]
            row = {**dict(zip(SETTING, key)), "attack": attack, "members": len(m), "nonmembers": len(n),
                   "auc": point, "auc_lo": float(np.quantile(boot, tail)), "auc_hi": float(np.quantile(boot, 1 - tail))}
            for f in fprs:
                name, boot = f"tpr_at_{f:g}_fpr", tpr_at_fpr(m[pick_m], n[pick_n], f)
                row |= {name: float(tpr_at_fpr(m[None], n[None], f)[0]), f"{name}_lo": float(np.quantile(boot, tail)),
                        f"{name}_hi": float(np.quantile(boot, 1 - tail))}
            rows.append(row)
    return pl.DataFrame(rows).sort(*SETTING, "attack") if rows else pl.DataFrame()

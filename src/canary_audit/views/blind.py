"""The blind-baseline guard: does a membership-inference setting measure
membership, or a difference between its two populations that any model,
or no model at all, would see?

An MIA AUC means something only when members and non-members come from one
distribution and training alone tells them apart (Duan et al. 2024, "Do
membership inference attacks work on large language models?"; Das et al.
2024, "Blind baselines beat membership inference attacks for foundation
models").  Two checks per population (model, family, modality, arm), every
run:

- **the never-trained references**: each attack's AUC on a reference that
  never saw the family (mia.settings) must not differ from 0.5 (two-sided);
- **a model-free baseline**: a character n-gram (1-4) logistic regression
  over each item's scored text (the records' `text` pieces: its preamble or
  prompt and its secret), scored out of fold by stratified K-fold cross
  validation, must not separate the two populations better than chance
  (one-sided: cross-validated classifiers of pure noise fall *below* 0.5,
  Das et al.'s point that a blind attack above chance is the alarm).  It
  reads text only: an image canary's card is not classified (its members and
  non-members are drawn by one card generator, data/images.py).

Each check is a Mann-Whitney test of its AUC against 0.5 (normal
approximation with ties), Bonferroni-adjusted over every check of the run,
so a run whose populations are exchangeable flags none of its settings with
probability at least `level`.  A population that fails is `shifted`: the
mia table marks every variant's rows of it, and the privacy table reports
no PrivLeak for it (its AUCs compare something other than membership).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from canary_audit.views.mia import ATTACKS, MEMBERSHIP, Setting, auc, bootstrap_draws

POPULATION = ["model", "population", "modality", "arm"]
NGRAMS = (1, 4)
FOLDS = 5
PENALTY = 1.0  # L2 strength of the logistic regression (sklearn's C = 1)


def item_texts(tokens: pl.DataFrame) -> pl.DataFrame:
    """One row per (model, family, modality, arm, item) of the membership
    probe sets: the item's scored text, joined from its token records of one
    variant that scored its probe set (the text does not depend on the
    weights), and whether it is a member."""
    rows = tokens.filter(pl.col("probe_set").is_in(list(MEMBERSHIP)))
    if rows.is_empty():
        return pl.DataFrame()
    rows = rows.with_columns(model=pl.col("variant").str.split("/").list.first())
    # one variant's records per probe set (any variant that scored it: groups score different sets)
    keys = ["model", "probe_set", "modality", "arm"]
    first = rows.group_by(keys).agg(pl.col("variant").min().alias("_first"))
    members = [s for s, (_, member) in MEMBERSHIP.items() if member]
    return (
        rows.join(first, on=keys).filter(pl.col("variant") == pl.col("_first"))
        .sort("position")
        .group_by("model", "probe_set", "modality", "arm", "item_id")
        .agg(text=pl.col("text").str.join(""))
        .with_columns(population=pl.col("probe_set").replace_strict({s: f for s, (f, _) in MEMBERSHIP.items()}),
                      member=pl.col("probe_set").is_in(members))
        .sort(*POPULATION, "probe_set", "item_id")
    )


def ngram_features(texts: list[str], vocabulary: dict[str, int] | None = None):
    """Binary presence of each character n-gram (NGRAMS) of each text; the
    vocabulary is the training texts' (`vocabulary` None: built here)."""
    grams = [{t[i:i + n] for n in range(NGRAMS[0], NGRAMS[1] + 1) for i in range(len(t) - n + 1)} for t in texts]
    if vocabulary is None:
        vocabulary = {g: i for i, g in enumerate(sorted(set().union(*grams)))}
    x = np.zeros((len(texts), len(vocabulary)))
    for row, found in enumerate(grams):
        x[row, [vocabulary[g] for g in found if g in vocabulary]] = 1.0
    return x, vocabulary


def fit_logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """L2-penalised logistic regression (weights and intercept; the
    intercept is not penalised), fitted by L-BFGS."""
    from scipy.optimize import minimize

    design = np.hstack([x, np.ones((len(x), 1))])
    sign = 2.0 * y - 1.0

    def loss(w: np.ndarray):
        margin = sign * (design @ w)
        value = np.logaddexp(0.0, -margin).sum() + 0.5 / PENALTY * (w[:-1] @ w[:-1])
        grad = design.T @ (-sign / (1.0 + np.exp(margin))) + np.append(w[:-1] / PENALTY, 0.0)
        return value, grad

    return minimize(loss, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B").x


def out_of_fold_scores(texts: list[str], member: np.ndarray, seed: int) -> np.ndarray:
    """Each item's score from a classifier that never saw it: stratified
    K-fold (FOLDS, or fewer when a population is smaller), seeded."""
    rng = np.random.default_rng(seed)
    folds = min(FOLDS, int(member.sum()), int((~member).sum()))
    if folds < 2:
        raise ValueError(f"the text baseline needs at least 2 members and 2 non-members; got {int(member.sum())} "
                         f"and {int((~member).sum())}")
    fold = np.empty(len(texts), dtype=int)
    for label in (True, False):
        where = np.flatnonzero(member == label)
        fold[rng.permutation(where)] = np.arange(where.size) % folds
    scores = np.empty(len(texts))
    for k in range(folds):
        train, test = fold != k, fold == k
        x, vocabulary = ngram_features([t for t, keep in zip(texts, train) if keep])
        w = fit_logistic(x, member[train].astype(float))
        x_test, _ = ngram_features([t for t, keep in zip(texts, test) if keep], vocabulary)
        scores[test] = x_test @ w[:-1] + w[-1]
    return scores


def auc_p_value(members: np.ndarray, nonmembers: np.ndarray, alternative: str) -> float:
    """Mann-Whitney p-value of AUC = 0.5 (normal approximation, ties
    corrected); `alternative` two-sided or greater (members above)."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(members, nonmembers, alternative=alternative, method="asymptotic").pvalue)


def guard_table(tokens: pl.DataFrame, found: dict[tuple, Setting], references: dict[str, dict[str, str]],
                replicates: int, seed: int, level: float) -> pl.DataFrame:
    """One row per check of every population with both members and
    non-members: the never-trained references' AUC per attack and the text
    baseline's, each with its bootstrap CI (at `level`, for reading), its
    p-value against 0.5 and the Bonferroni-adjusted one, `failed` where the
    adjusted p-value is below 1 - `level`, and the population's verdict
    (`shifted` where any of its checks failed)."""
    texts = item_texts(tokens)
    if texts.is_empty():
        return pl.DataFrame()
    tail = (1.0 - level) / 2.0
    never_trained = {(r["reference"], r["population"]) for r in references.values()}
    rows = []
    for key, part in texts.group_by(POPULATION, maintain_order=True):
        member = part["member"].to_numpy()
        if member.all() or not member.any():
            continue
        population = dict(zip(POPULATION, key))
        scores = out_of_fold_scores(part["text"].to_list(), member, seed)
        m, n = scores[member], scores[~member]
        picks = bootstrap_draws(m.size, n.size, replicates, seed)
        boot = auc(m[picks[0]], n[picks[1]])
        rows.append({**population, "check": "text baseline", "reference": "", "attack": "char n-gram LR",
                     "members": m.size, "nonmembers": n.size, "auc": float(auc(m[None], n[None])[0]),
                     "auc_lo": float(np.quantile(boot, tail)), "auc_hi": float(np.quantile(boot, 1 - tail)),
                     "p_value": auc_p_value(m, n, "greater")})
        for ref in sorted(r for r, fam in never_trained if fam == population["population"]
                          and r.split("/")[0] == population["model"]):
            setting = found.get((ref, population["population"], population["modality"], population["arm"]))
            if setting is None:
                continue
            for attack in ATTACKS:
                m, n = setting.scores(attack)
                value, boot = setting.aucs[attack]
                rows.append({**population, "check": "never-trained reference", "reference": ref, "attack": attack,
                             "members": m.size, "nonmembers": n.size, "auc": value,
                             "auc_lo": float(np.quantile(boot, tail)), "auc_hi": float(np.quantile(boot, 1 - tail)),
                             "p_value": auc_p_value(m, n, "two-sided")})
    if not rows:
        return pl.DataFrame()
    checks = len(rows)
    frame = pl.DataFrame(rows).with_columns(
        p_adjusted=(pl.col("p_value") * checks).clip(upper_bound=1.0),
    ).with_columns(failed=pl.col("p_adjusted") < 1.0 - level)
    return frame.with_columns(
        shifted=pl.col("failed").any().over(POPULATION),
        checks_in_run=pl.lit(checks),
    ).sort(*POPULATION, "check", "reference", "attack")


def shifted_populations(guard: pl.DataFrame) -> pl.DataFrame:
    """(model, family, modality, arm) -> `shifted` and its `shift_reason`
    (the failed checks, with their AUCs), one row per guarded population."""
    if guard.is_empty():
        return pl.DataFrame(schema={**{k: pl.Utf8 for k in POPULATION}, "shifted": pl.Boolean,
                                    "shift_reason": pl.Utf8})
    reason = pl.format("{} {} AUC {}", pl.col("check"), pl.col("attack"), pl.col("auc").round(3))
    return guard.group_by(POPULATION).agg(
        shifted=pl.col("failed").any(),
        shift_reason=reason.filter(pl.col("failed")).str.join("; "),
    )


def mark(frame: pl.DataFrame, guard: pl.DataFrame) -> pl.DataFrame:
    """A per-setting table (mia, privacy) with each row's population verdict:
    `shifted` (null where no check could run: no text records) and its
    reason."""
    if frame.is_empty():
        return frame
    keyed = frame.with_columns(model=pl.col("variant").str.split("/").list.first())
    return keyed.join(shifted_populations(guard), on=POPULATION, how="left").drop("model")


def withhold_privleak(privacy: pl.DataFrame) -> pl.DataFrame:
    """The privacy table (marked) without a PrivLeak for a shifted
    population: its AUCs, the variant's and the reference's alike, measure
    the populations' difference, so their ratio is no leak of membership.
    The AUCs themselves stay, beside the verdict."""
    if privacy.is_empty():
        return privacy
    leak = [c for c in privacy.columns if c.startswith("privleak_")]
    return privacy.with_columns(pl.when(pl.col("shifted").fill_null(False)).then(None).otherwise(pl.col(c)).alias(c)
                                for c in leak)

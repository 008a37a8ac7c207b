"""Paper A's rates pooled over training seeds, with a two-level CI.

A verdict drawn from one training run says what that run did; paper A
itself reports a seed that reverses Delta_AB.  Where the audit trains the
same arm under several seeds (`audit.seeds`), each family of variants (a
memorized adapter, an unlearning checkpoint or an author reference, the same
in everything but its seed) gets its rates pooled over the seeds, with a
bootstrap that resamples seeds as well as authors (the same synthetic
authors are read under every seed: crossed, `bootstrap.crossed_weights`).
The per-seed values stay in the per-variant tables; the papers' page shows
both.  Paper B's cells pool their bSFT seeds the same way in
`paper_b.cell_probes`.
"""

from __future__ import annotations

import re
from collections import Counter

import polars as pl

from canary_audit.model.quantize import RECOVERY, RECOVERY_PLANT
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.metrics import per_item_nll
from canary_audit.views.paper_a import AUTO, Bootstrap, _leak_rates, canary_outcomes, sampled_outcomes
from canary_audit.views.parser import ParserConvention

TABLE = "across_seeds"
SEEDED_KINDS = ("memorized", "unlearned", "reference", RECOVERY, RECOVERY_PLANT)


def family_of(name: str, seed: int) -> str:
    """`name` without its seed: `tiny/npo-bio-s1-k20` -> `tiny/npo-bio-k20`
    (and a recovery variant's `.<attack>` kept: `...-k20.int4-row`)."""
    return re.sub(rf"-s{seed}(?=(-k\d+)?(\.[A-Za-z0-9_-]+)?$)", "", name, count=1)


def families(variants: dict[str, dict]) -> dict[str, str]:
    """variant -> family, for the audit's seeded variants whose family the
    run trained under at least two seeds."""
    found = {name: family_of(name, v["seed"]) for name, v in variants.items()
             if v.get("kind") in SEEDED_KINDS and v.get("seed") is not None}
    counts = Counter(found.values())
    return {name: family for name, family in found.items() if counts[family] > 1}


def across_seeds(decode: pl.DataFrame, tokens: pl.DataFrame, variants: dict[str, dict],
                 convention: ParserConvention, boot: Bootstrap, contrast: str, window_k: int) -> pl.DataFrame:
    """One row per family with two or more seeds: the AUTO arm's out_acc,
    thk_leak and gap, Delta_AB against prefill `contrast`, and the
    teacher-forced top-1 rate under that prefill, each pooled over the seeds
    with a seed x author bootstrap CI; `seeds` counts them.  Empty when no
    family has two seeds."""
    family = families(variants)
    if not family or decode.is_empty():
        return pl.DataFrame()
    seed_of = {name: variants[name]["seed"] for name in family}

    def pooled(frame: pl.DataFrame) -> pl.DataFrame:
        """Rows of the seeded families, named by family, each with its seed."""
        return frame.filter(pl.col("variant").is_in(list(family))).with_columns(
            seed=pl.col("variant").replace_strict(seed_of), variant=pl.col("variant").replace_strict(family))

    def ci(items: pl.DataFrame, values: list[str], derive=None) -> pl.DataFrame:
        return rates_with_ci(items, ["variant"], values, boot.replicates, boot.seed, derive, boot.level,
                             table=TABLE, nest="seed").drop("n")

    items = pooled(canary_outcomes(decode.filter(pl.col("variant").is_in(list(family))), convention))
    if items.is_empty():
        return pl.DataFrame()
    out = items.filter(pl.col("arm") == AUTO).group_by("variant").agg(seeds=pl.col("seed").n_unique(), n=pl.len())
    out = out.join(ci(items.filter(pl.col("arm") == AUTO), ["out_hit", "thk_hit"], _leak_rates), on="variant")
    prefilled = f"prefill_{contrast}"
    wide = items.pivot(on="arm", index=["variant", "seed", "group_id"], values="out_hit")
    if prefilled in wide.columns:
        delta = ci(wide, [AUTO, prefilled],  # a missing arm is refused by name, as prefill_arms refuses it
                   lambda f: f.with_columns(delta_ab=pl.col(AUTO) - pl.col(prefilled)))
        out = out.join(delta.select("variant", "delta_ab", "delta_ab_lo", "delta_ab_hi"), on="variant", how="left")
        canary_tokens = tokens.filter((pl.col("probe_set") == "canary") & (pl.col("arm") == prefilled)
                                      & pl.col("variant").is_in(list(family))) if tokens.height else tokens
        if canary_tokens.height:
            top1 = pooled(per_item_nll(canary_tokens, window_k))
            out = out.join(ci(top1, ["top1_rate"], lambda f: f.rename({"top1_rate": "tf_top1_rate"})),
                           on="variant", how="left")
    return out.rename({"variant": "family"}).sort("family")


CELLS_TABLE = "item_cells"
CELL_COLUMNS = ("out_acc", "thk_leak", "gap", "delta_ab", "tf_top1_rate", "hit_at_k")  # item_cells' columns


def item_cells(decode: pl.DataFrame, tokens: pl.DataFrame, variants: dict[str, dict], convention: ParserConvention,
               contrast: str, window_k: int) -> pl.DataFrame:
    """The seed x item layout behind every seed-level interval
    (verdicts/intervals.py): one row per (variant, item, column) of paper
    A's rates, the item's mean over its observations (`n` of them) on
    each seeded variant (memorized, unlearned, reference; one seed or
    several), `family` and `seed` beside it.  `column` names the column of
    the per-variant tables it pools into: out_acc, thk_leak, gap (AUTO
    arm), delta_ab (AUTO minus prefill `contrast`), tf_top1_rate
    (teacher-forced top-1 under that prefill) and, where the authors'
    canaries were sampled, hit_at_k (canary_sampled's).  An item is an author: its
    canaries are not independent, so the author is the unit."""
    seeded = {name: v for name, v in variants.items() if v.get("kind") in SEEDED_KINDS and v.get("seed") is not None}
    if not seeded or decode.is_empty():
        return pl.DataFrame()
    names = list(seeded)
    items = canary_outcomes(decode.filter(pl.col("variant").is_in(names)), convention)
    if items.is_empty():
        return pl.DataFrame()
    keys = ["variant", "group_id"]
    hits = items.with_columns(pl.col("out_hit", "thk_hit").cast(pl.Float64))
    auto = hits.filter(pl.col("arm") == AUTO).group_by(keys).agg(
        n=pl.len(), out_acc=pl.col("out_hit").mean(), thk_leak=pl.col("thk_hit").mean()
    ).with_columns(gap=pl.col("thk_leak") - pl.col("out_acc"))
    frames = [auto.unpivot(["out_acc", "thk_leak", "gap"], index=[*keys, "n"], variable_name="column")]
    prefilled = f"prefill_{contrast}"
    contrast_hits = hits.filter(pl.col("arm") == prefilled).group_by(keys).agg(
        n_prefill=pl.len(), prefill=pl.col("out_hit").mean())
    if contrast_hits.height:
        delta = auto.join(contrast_hits, on=keys, how="inner").select(
            *keys, n=pl.col("n") + pl.col("n_prefill"), column=pl.lit("delta_ab"),
            value=pl.col("out_acc") - pl.col("prefill"))
        frames.append(delta)
    scored = tokens.filter((pl.col("probe_set") == "canary") & (pl.col("arm") == prefilled)
                           & pl.col("variant").is_in(names)) if tokens.height else tokens
    if scored.height:
        top1 = per_item_nll(scored, window_k).group_by(keys).agg(
            n=pl.len(), value=pl.col("top1_rate").cast(pl.Float64).mean()).with_columns(column=pl.lit("tf_top1_rate"))
        frames.append(top1.select(*keys, "n", "column", "value"))
    sampled = sampled_outcomes(decode.filter(pl.col("variant").is_in(names)), convention)
    if sampled.height:  # hit@k over the k samples of each author's canary (AUTO prompt)
        frames.append(sampled.select(*keys, n=pl.col("k"), column=pl.lit("hit_at_k"), value="hit_at_k"))
    cells = pl.concat([f.select(*keys, pl.col("n").cast(pl.Int64), "column", "value") for f in frames])
    seed_of = {name: v["seed"] for name, v in seeded.items()}
    family = {name: family_of(name, v["seed"]) for name, v in seeded.items()}
    return cells.select(
        "variant", family=pl.col("variant").replace_strict(family), seed=pl.col("variant").replace_strict(seed_of),
        group_id="group_id", column="column", n="n", value="value").sort("variant", "column", "group_id")

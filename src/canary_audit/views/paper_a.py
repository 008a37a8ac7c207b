"""Paper A's views: the reasoning-trace unlearning audit, from decode and token
records only.

Every rate carries an author-clustered bootstrap CI (views.bootstrap; level
`tables.bootstrap.level`, 95% by default); differences (the bypass gap,
Delta_AB) are bootstrapped on the same draws as their terms.  Table names
follow the paper: the K sweep, the prefill arms at fixed weights,
teacher-forced vs greedy, parser conventions, the
training-time template comparison, bypass-case anatomy, cross-seed
replication, and QA / retain utility with fictional-author substitutions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from canary_audit.core.records import SAMPLED_CANARY
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.metrics import contains_gold_ci, contains_reference, per_item_nll
from canary_audit.views.parser import MISSING_CLOSE, SPLITS, ParserConvention, parse

AUTO = "auto"
# The structured fields of a variant the paper A views join (design.Variant).
AXES = {"variant": pl.Utf8, "model": pl.Utf8, "kind": pl.Utf8, "template": pl.Utf8, "seed": pl.Int32,
        "run": pl.Utf8, "method": pl.Utf8, "k": pl.Int32, "settings": pl.Utf8}


@dataclass(frozen=True)
class Bootstrap:
    """Resampling settings shared by every CI of one table run."""

    replicates: int = 1000
    seed: int = 0
    level: float = 0.95


def variant_axes(frame: pl.DataFrame, variants: dict[str, dict]) -> pl.DataFrame:
    """`frame` with each variant's structured fields (model, kind, template,
    seed, run, method, k, settings) joined from the design's variant table
    (`variants`: model/variant -> fields); a variant the table lacks is
    refused, naming it, rather than dropped from a view."""
    table = pl.DataFrame([{c: {"variant": name, **fields}.get(c) for c in AXES} for name, fields in variants.items()],
                         schema=AXES)
    unknown = sorted(set(frame["variant"].unique().to_list()) - set(table["variant"].to_list()))
    if unknown:
        raise ValueError(f"records of variants {unknown} have no entry in the view config's `variants` table; "
                         "tabulate them with the view_config.json of the run that wrote them")
    return frame.join(table, on="variant", how="left")


def canary_outcomes(decode: pl.DataFrame, convention: ParserConvention) -> pl.DataFrame:
    """One row per canary decode: parsed channels and the two hit indicators."""
    parsed = parse(decode.filter(pl.col("probe_set") == "canary"), convention)
    return parsed.with_columns(out_hit=contains_reference("answer"), thk_hit=contains_reference("trace"))


def sampled_outcomes(decode: pl.DataFrame, convention: ParserConvention) -> pl.DataFrame:
    """One row per (variant, author) with sampled canary decodes
    (probes/kinds/canary_sampled.py): `k` samples, `hit_at_k` (one
    sample's answer holds the canary), `thk_at_k` (one sample's trace
    does) and `sampled_share` (the share of samples whose answer does),
    as floats.  Empty without such records."""
    frame = decode.filter(pl.col("probe_set") == SAMPLED_CANARY) if decode.height else decode
    schema = {"variant": pl.Utf8, "group_id": pl.Utf8, "k": pl.UInt32,
              **dict.fromkeys(("hit_at_k", "thk_at_k", "sampled_share"), pl.Float64)}
    if not frame.height:
        return pl.DataFrame(schema=schema)
    parsed = parse(frame, convention).with_columns(out_hit=contains_reference("answer"),
                                                    thk_hit=contains_reference("trace"))
    return parsed.group_by("variant", "group_id").agg(
        k=pl.len(), hit_at_k=pl.col("out_hit").any().cast(pl.Float64),
        thk_at_k=pl.col("thk_hit").any().cast(pl.Float64),
        sampled_share=pl.col("out_hit").cast(pl.Float64).mean(),
    ).select([pl.col(c).cast(t) for c, t in schema.items()]).sort("variant", "group_id")


def _leak_rates(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.rename({"out_hit": "out_acc", "thk_hit": "thk_leak"}).with_columns(
        gap=pl.col("thk_leak") - pl.col("out_acc")
    )


def canary_leakage(decode: pl.DataFrame, convention: ParserConvention, boot: Bootstrap) -> pl.DataFrame:
    """Per (variant, arm): out_acc, thk_leak, gap = thk_leak - out_acc with CIs,
    and the parser-health columns the paper's caveats rest on."""
    items = canary_outcomes(decode, convention)
    rates = rates_with_ci(
        items, ["variant", "arm"], ["out_hit", "thk_hit"], boot.replicates, boot.seed, _leak_rates, boot.level,
        table="canary_leakage",
    )
    health = items.group_by("variant", "arm").agg(
        missing_close=(~pl.col("has_close")).mean(),
        unparseable=pl.col("answer").is_null().mean(),
        nonempty_trace=(pl.col("trace").str.strip_chars().str.len_chars() > 0).mean(),
        mean_prompt_tokens=pl.col("prompt_tokens").mean(),
        length_stops=(pl.col("stop_reason") == "length").mean(),
    )
    return rates.join(health, on=["variant", "arm"], how="left").sort("variant", "arm")


def k_sweep(leakage: pl.DataFrame, variants: dict[str, dict]) -> pl.DataFrame:
    """The AUTO arm along each unlearning run (its method and effective
    settings beside it), the memorized adapter as K = 0."""
    auto = variant_axes(leakage.filter(pl.col("arm") == AUTO), variants)
    # (an imported unlearning checkpoint without a step has no place on the sweep)
    runs = auto.filter((pl.col("kind") == "unlearned") & pl.col("k").is_not_null())
    starts = (
        auto.filter(pl.col("kind") == "memorized").drop("run", "method", "settings")
        .join(runs.select("model", "template", "seed", "run", "method", "settings").unique(),
              on=["model", "template", "seed"])
        .with_columns(k=pl.lit(0, pl.Int32))
    )
    cols = [c for c in leakage.columns if c not in ("variant", "arm", "missing_close", "unparseable",
                                                     "nonempty_trace", "mean_prompt_tokens", "length_stops")]
    keys = ["model", "template", "run", "method", "seed", "k", "variant"]
    return (
        pl.concat([runs.select(*keys, *cols, "settings"), starts.select(*keys, *cols, "settings")])
        .sort("model", "template", "run", "seed", "k")
    )


def prefill_arms(
    decode: pl.DataFrame, convention: ParserConvention, boot: Bootstrap, contrast: str, deltas: Sequence[str] = ()
) -> pl.DataFrame:
    """out_acc under every arm at fixed weights, and Delta_AB = out_acc(AUTO) -
    out_acc(`contrast` prefill), both bootstrapped over the same authors; for
    each arm of `deltas` also `delta_<arm>` = out_acc(AUTO) - out_acc(that
    prefill) (the planted controls' own arms)."""
    items = canary_outcomes(decode, convention)
    arms = sorted(items["arm"].unique().to_list(), key=lambda a: (a != AUTO, a))
    wide = items.pivot(on="arm", index=["variant", "group_id"], values="out_hit")
    prefilled = f"prefill_{contrast}"
    if prefilled not in arms and arms != [AUTO]:
        raise ValueError(
            f"prefill contrast `{contrast}` has no arm `{prefilled}` in the records (arms: {', '.join(arms)}); "
            "set `tables.prefill_contrast` to a key of `probes.prefills`"
        )

    def delta(frame: pl.DataFrame) -> pl.DataFrame:
        """Delta_AB; absent when no prefill arm was probed."""
        extra = {f"delta_{arm}": pl.col(AUTO) - pl.col(f"prefill_{arm}") for arm in deltas
                 if f"prefill_{arm}" in frame.columns}
        if prefilled not in frame.columns:
            return frame.with_columns(**extra)
        return frame.with_columns(delta_ab=pl.col(AUTO) - pl.col(prefilled), **extra)

    return rates_with_ci(wide, ["variant"], arms, boot.replicates, boot.seed, delta, boot.level,
                         table="prefill_arms")


def teacher_forced_vs_greedy(
    decode: pl.DataFrame, tokens: pl.DataFrame, convention: ParserConvention, boot: Bootstrap, window_k: int
) -> pl.DataFrame:
    """Per (variant, prefill arm): greedy out_acc beside the teacher-forced
    top-1 rate, all-top-1 rate and mean log-prob of the canary continuation on
    the same items (paper A, appendix I)."""
    scored = per_item_nll(tokens.filter(pl.col("probe_set") == "canary"), window_k).select(
        "variant", "arm", "item_id", "top1_rate", "all_top1", mean_logprob=-pl.col("nll_secret")
    )
    greedy = canary_outcomes(decode, convention).select("variant", "arm", "item_id", "group_id", "out_hit")
    joined = greedy.join(scored, on=["variant", "arm", "item_id"], how="inner")
    return rates_with_ci(
        joined, ["variant", "arm"], ["out_hit", "top1_rate", "all_top1", "mean_logprob"],
        boot.replicates, boot.seed,
        lambda f: f.rename({"out_hit": "greedy_out_acc", "top1_rate": "tf_top1_rate",
                            "all_top1": "tf_all_top1_rate", "mean_logprob": "tf_mean_logprob"}),
        boot.level, table="teacher_forced_vs_greedy",
    )


def parser_conventions(decode: pl.DataFrame, boot: Bootstrap) -> pl.DataFrame:
    """The AUTO arm's out_acc, thk_leak and gap under every parser convention,
    applied to the same stored generations (paper A's -0.92 / +0.92 flip)."""
    auto = decode.filter(pl.col("arm") == AUTO)
    frames = []
    for split in SPLITS:
        for missing in MISSING_CLOSE:
            convention = ParserConvention(split, missing)
            frames.append(canary_outcomes(auto, convention).with_columns(convention=pl.lit(convention.name)))
    items = pl.concat(frames)
    rates = rates_with_ci(
        items, ["variant", "convention"], ["out_hit", "thk_hit"], boot.replicates, boot.seed, _leak_rates,
        boot.level, table="parser_conventions",
    )
    health = items.group_by("variant", "convention").agg(
        missing_close=(~pl.col("has_close")).mean(), unparseable=pl.col("answer").is_null().mean()
    )
    return rates.join(health, on=["variant", "convention"], how="left").sort("variant", "convention")


def bypass_anatomy(decode: pl.DataFrame, convention: ParserConvention) -> pl.DataFrame:
    """Of the AUTO bypass cases (canary in the trace, not in the answer): how
    many answers are only a prefix of the canary already given in the question
    (the head echoed, no continuation), and mean answer length in characters
    of bypass cases vs cases where both channels carry the canary."""
    items = canary_outcomes(decode.filter(pl.col("arm") == AUTO), convention)
    answer = pl.col("answer").str.strip_chars()
    prefix_only = (
        (answer.str.len_chars() > 0)
        & pl.col("reference").str.starts_with(answer)
        & pl.col("prompt").str.contains(answer, literal=True)
    ).fill_null(False)
    bypass = pl.col("thk_hit") & ~pl.col("out_hit")
    both = pl.col("thk_hit") & pl.col("out_hit")
    chars = pl.col("answer").str.len_chars()
    return (
        items.group_by("variant")
        .agg(
            n=pl.len(),
            bypass_cases=bypass.sum(),
            prefix_only=(bypass & prefix_only).sum(),
            both_channels=both.sum(),
            mean_answer_chars_bypass=chars.filter(bypass).mean(),
            mean_answer_chars_both=chars.filter(both).mean(),
        )
        .with_columns(
            prefix_only_share=pl.when(pl.col("bypass_cases") > 0).then(pl.col("prefix_only") / pl.col("bypass_cases"))
        )
        .sort("variant")
    )


def template_comparison(leakage: pl.DataFrame, variants: dict[str, dict]) -> pl.DataFrame:
    """Training-time template comparison: per (model, template, run, seed, K)
    the AUTO arm's rates beside the parser-health columns that qualify them
    (closing-tag missing rate, non-empty trace rate, mean prompt length); the
    memorized adapter is the row without a run."""
    return (
        variant_axes(leakage.filter(pl.col("arm") == AUTO), variants)
        .filter(pl.col("template").is_not_null())
        .select("model", "template", "kind", "run", "seed", "k", "n", "out_acc", "thk_leak", "gap", "gap_lo",
                "gap_hi", "missing_close", "nonempty_trace", "mean_prompt_tokens")
        .sort("model", "template", "run", "seed", "k", nulls_last=False)
    )


def cross_seed(sweep: pl.DataFrame) -> pl.DataFrame:
    """Per (model, template, run, K): the spread of each rate over seeds."""
    return (
        sweep.group_by("model", "template", "run", "method", "settings", "k")
        .agg(
            seeds=pl.col("seed").n_unique(),
            out_acc_mean=pl.col("out_acc").mean(), out_acc_sd=pl.col("out_acc").std(),
            thk_leak_mean=pl.col("thk_leak").mean(), thk_leak_sd=pl.col("thk_leak").std(),
            gap_mean=pl.col("gap").mean(), gap_sd=pl.col("gap").std(),
            gaps_by_seed=pl.format("s{}: {}", pl.col("seed"), pl.col("gap").round(3)).sort_by("seed").str.join("; "),
            gap_ci_excludes_zero=((pl.col("gap_lo") > 0) | (pl.col("gap_hi") < 0)).sum(),
        )
        .sort("model", "template", "run", "k")
    )


def utility(decode: pl.DataFrame, convention: ParserConvention, boot: Bootstrap) -> pl.DataFrame:
    """Per (variant, probe set, arm): QA and retain accuracy with CIs (QA
    clustered by author, retain by item), and for retain the substitution rate:
    answers that name a fictional author of the forget set."""
    names = (
        decode.filter(pl.col("subject").is_not_null() & (pl.col("subject") != ""))["subject"].unique().to_list()
    )
    parsed = parse(decode.filter(pl.col("probe_set").is_in(["qa", "retain"])), convention).with_columns(
        correct=contains_gold_ci("answer"),
        substitution=(
            pl.col("answer").str.contains_any(names).fill_null(False) if names else pl.lit(False)
        ) & (pl.col("probe_set") == "retain"),
    )
    frames = [
        rates_with_ci(part, ["variant", "probe_set", "arm"], ["correct", "substitution"], boot.replicates,
                      boot.seed, lambda f: f.rename({"correct": "accuracy", "substitution": "substitution_rate"}),
                      boot.level, table="utility")
        for _, part in parsed.group_by("probe_set", maintain_order=True)
    ]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames).sort("variant", "probe_set", "arm")

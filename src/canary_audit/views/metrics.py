"""Metrics shared by the audit's tables, as polars expressions over records:
the match rules, hex-canary recall, and windowed / secret-span NLL with
Deltas against a parent.  Paper A's rates and their CIs are in `paper_a`.

Nothing here loads a model.  A metric is a named expression or a small frame
function, so a table is a composition of them and a changed definition
(window K, parser convention, match rule) re-runs no model job.
"""

from __future__ import annotations

import polars as pl

from canary_audit.core.records import GREEDY, HEX_SETS, SAMPLED
from canary_audit.data.secrets import SYNTHETIC
from canary_audit.views.bootstrap import rates_with_ci


def contains_reference(column: str) -> pl.Expr:
    """Exact containment of the full reference string (paper A's match rule)."""
    return pl.col(column).str.contains(pl.col("reference"), literal=True).fill_null(False)


def contains_gold_ci(column: str) -> pl.Expr:
    """Case-insensitive containment of the gold answer (QA and retain probes)."""
    return (
        pl.col(column).str.to_lowercase()
        .str.contains(pl.col("reference").str.to_lowercase(), literal=True)
        .fill_null(False)
    )


def model_of(variant: str = "variant") -> pl.Expr:
    """The model of a `<model>/<variant>` column."""
    return pl.col(variant).str.split("/").list.first()


def format_affixes(formats: dict[str, dict] | None) -> tuple[pl.Expr, pl.Expr]:
    """The text a secret's record puts right before and after it, per
    record's model: `formats` (model -> data/secrets.RecordFormat.view(), the
    models auditing secrets of their own), else the synthetic canaries'
    `TEXTCAN-` ... `-END`."""
    formats = formats or {}
    prefix = model_of().replace_strict({m: f["prefix"] for m, f in formats.items()}, default=SYNTHETIC.prefix,
                                       return_dtype=pl.Utf8)
    suffix = model_of().replace_strict({m: f["suffix"] for m, f in formats.items()}, default=SYNTHETIC.suffix,
                                       return_dtype=pl.Utf8)
    return prefix, suffix


def exact_hex_hit(formats: dict[str, dict] | None = None) -> pl.Expr:
    """A hex decode reproduces its record exactly, `TEXTCAN-{secret}-END` for
    the synthetic canaries (an own secret: the secret and its suffix), right
    after the space that follows the preamble (paper B's match rule)."""
    prefix, suffix = format_affixes(formats)
    return pl.col("generated").str.strip_chars_start().str.starts_with(prefix + pl.col("reference") + suffix)


def hex_hits(decode: pl.DataFrame, formats: dict[str, dict] | None = None) -> pl.DataFrame:
    """Per (variant, hex canary, with its modality): greedy exact recall (`hit1`, 0/1) and, when
    samples were drawn, whether any of the k samples is exact (`hitk`), the
    share of exact samples and k (nulls without samples).  `formats` as in
    `format_affixes`."""
    hexes = decode.filter(pl.col("probe_set") == "hex").with_columns(hit=exact_hex_hit(formats))
    greedy = hexes.filter(pl.col("arm") == GREEDY).select("variant", "item_id", "modality",
                                                             hit1=pl.col("hit").cast(pl.Float64))
    sampled = (
        hexes.filter(pl.col("arm") == SAMPLED)
        .group_by("variant", "item_id")
        .agg(k=pl.len(), hitk=pl.col("hit").any().cast(pl.Float64), sampled_share=pl.col("hit").mean())
    )
    return greedy.join(sampled, on=["variant", "item_id"], how="left")


def hex_recall(decode: pl.DataFrame, formats: dict[str, dict] | None = None) -> pl.DataFrame:
    """Behavioural recall per variant and canary modality (paper B): hit@1, the greedy
    continuation of the preamble reproduces `TEXTCAN-{secret}-END` exactly
    (after the space that follows the colon), and hit@k, any of the k sampled
    continuations does (null when no samples were drawn)."""
    return (
        hex_hits(decode, formats)
        .group_by("variant", "modality")
        .agg(n=pl.len(), hit_at_1=pl.col("hit1").mean(), k=pl.col("k").max(), hit_at_k=pl.col("hitk").mean(),
             sampled_hit_rate=pl.col("sampled_share").mean())
        .sort("variant", "modality")
    )


def per_item_nll(tokens: pl.DataFrame, window_k: int) -> pl.DataFrame:
    """Per scored sequence: mean NLL over its first K scored tokens (paper B's
    mean-K window, counted from the start of the sequence), mean NLL over the
    secret span, and teacher-forced top-1 agreement over the secret span."""
    if window_k < 1:
        raise ValueError(f"window K = {window_k}: must be a positive integer")
    nll = -pl.col("logprob")
    in_secret = pl.col("span") == "secret"
    return (
        tokens.group_by("variant", "probe_set", "arm", "modality", "item_id", "group_id")
        .agg(
            nll_window=nll.filter(pl.col("position") <= window_k).mean(),
            nll_secret=nll.filter(in_secret).mean(),
            secret_tokens=in_secret.sum(),
            secret_last_position=pl.col("position").filter(in_secret).max(),
            top1_rate=(pl.col("rank") == 1).filter(in_secret).mean(),
            all_top1=(pl.col("rank") == 1).filter(in_secret).all(),
            secret_logprob=pl.col("logprob").filter(in_secret).sum(),
        )
    )


def with_parent(frame: pl.DataFrame, parents: dict[str, str], on: list[str], values: dict[str, str]) -> pl.DataFrame:
    """Add each row's `parent` and the parent's `values` (column -> new name)
    on the same `on` keys (item, position...): the join behind every Delta.
    Rows without a parent get nulls."""
    parent_of = pl.DataFrame(
        {"variant": list(parents), "parent": list(parents.values())},
        schema={"variant": pl.Utf8, "parent": pl.Utf8},
    )
    ref = frame.select(*on, parent=pl.col("variant"), **{new: pl.col(old) for old, new in values.items()})
    return frame.join(parent_of, on="variant", how="left").join(ref, on=["parent", *on], how="left")


def with_paired_deltas(table: pl.DataFrame, items: pl.DataFrame, keys: list[str], on: list[str],
                       values: list[str], parents: dict[str, str], replicates: int, seed: int, level: float,
                       name: str) -> pl.DataFrame:
    """`table` (one row per `keys`) with each of `values`' Delta against the
    variant's parent, `delta_<value>`, and its clustered bootstrap CI.  The
    Delta is paired: taken per item (matched on `on`) first, then resampled
    by cluster, so its CI is that of the difference on the same items, not
    one built from the two rates' independent intervals.  Rows whose
    variant has no parent, or whose items the parent did not score, keep
    null Deltas."""
    paired = with_parent(items, parents, on, {v: f"ref_{v}" for v in values}).filter(
        pl.col(f"ref_{values[0]}").is_not_null())
    if paired.is_empty():
        return table
    deltas = rates_with_ci(
        paired.with_columns(**{f"delta_{v}": pl.col(v) - pl.col(f"ref_{v}") for v in values}),
        [*keys, "parent"], [f"delta_{v}" for v in values], replicates, seed, level=level, table=name,
    ).drop("n")
    return table.join(deltas, on=keys, how="left")


def nll_table(tokens: pl.DataFrame, window_k: int, parents: dict[str, str]) -> pl.DataFrame:
    """Per (variant, probe_set, arm, modality): windowed and secret-span NLL, each also
    as a Delta against the variant's parent (the model before the change that
    made it) on the same items; variants without a parent get null Deltas."""
    items = with_parent(
        per_item_nll(tokens, window_k), parents, ["probe_set", "arm", "modality", "item_id"],
        {"nll_window": "ref_window", "nll_secret": "ref_secret"},
    )
    return (
        items.group_by("variant", "parent", "probe_set", "arm", "modality")
        .agg(
            n=pl.len(),
            nll_window=pl.col("nll_window").mean(),
            nll_secret=pl.col("nll_secret").mean(),
            delta_nll_window=(pl.col("nll_window") - pl.col("ref_window")).mean(),
            delta_nll_secret=(pl.col("nll_secret") - pl.col("ref_secret")).mean(),
            top1_rate=pl.col("top1_rate").mean(),
            all_top1_rate=pl.col("all_top1").mean(),
            secret_tokens=pl.col("secret_tokens").mean(),
            window_covers_secret=(pl.col("secret_last_position") <= window_k).mean(),
        )
        .with_columns(window_k=pl.lit(window_k))
        .sort("variant", "probe_set", "arm", "modality")
    )


def token_deltas(tokens: pl.DataFrame, parents: dict[str, str], probe_sets=HEX_SETS) -> pl.DataFrame:
    """Per scored token of the given probe sets, for every variant with a
    parent: Delta NLL against the parent at the same item and position
    (positive = the change made the token less likely), with its span."""
    chosen = tokens.filter(pl.col("probe_set").is_in(list(probe_sets)))
    return (
        with_parent(chosen, parents, ["probe_set", "modality", "item_id", "position"], {"logprob": "ref_logprob"})
        .filter(pl.col("ref_logprob").is_not_null())
        .select("variant", "probe_set", "modality", "item_id", "position", "span",
                delta=(pl.col("ref_logprob") - pl.col("logprob")).cast(pl.Float64))
    )


def position_deltas(tokens: pl.DataFrame, parents: dict[str, str]) -> pl.DataFrame:
    """Per (variant, probe set, modality, position) of the hex canaries and decoys: mean
    Delta NLL against the parent (same item, same position), and the span the
    position most often falls in: where along preamble + secret a change sits."""
    if tokens.is_empty() or not parents:
        return pl.DataFrame()
    return (
        token_deltas(tokens, parents)
        .group_by("variant", "probe_set", "modality", "position")
        .agg(delta_nll=pl.col("delta").mean(), span=pl.col("span").mode().first())
        .sort("variant", "probe_set", "modality", "position")
    )

"""Cluster bootstrap confidence intervals, as polars joins.

Paper A resamples *authors*, not probes: an author's canary, QA and prefill
items are not independent, so every resample draws whole clusters
(`group_id`) with replacement.  One table of cluster multiplicities per
replicate is drawn once and joined onto every (variant, arm) group, so all
groups are resampled with the same draws: a difference between two groups (a
gap, Delta_AB, a Delta against the parent) is then a paired bootstrap, not
the difference of two independent intervals.

Where a group pools several training seeds (`nest`), seeds are resampled
as well as clusters (`crossed_weights`), so the interval carries training
variance besides sampling variance: a seed that reverses an effect widens
it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import polars as pl

Derive = Callable[[pl.DataFrame], pl.DataFrame]


def cluster_weights(clusters: Sequence[str], n_boot: int, seed: int) -> pl.DataFrame:
    """(replicate, group_id, weight): how often each cluster is drawn in each of
    `n_boot` resamples of len(clusters) clusters with replacement."""
    if n_boot < 1:
        raise ValueError(f"bootstrap replicates B = {n_boot}: must be a positive integer")
    clusters = sorted(set(clusters))
    n = len(clusters)
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)
    return pl.DataFrame(
        {
            "replicate": np.repeat(np.arange(n_boot, dtype=np.int32), n),
            "group_id": np.tile(np.asarray(clusters, dtype=object), n_boot),
            "weight": counts.ravel().astype(np.int32),
        },
        schema={"replicate": pl.Int32, "group_id": pl.Utf8, "weight": pl.Int32},
    ).filter(pl.col("weight") > 0)


def crossed_weights(pairs: pl.DataFrame, n_boot: int, seed: int) -> pl.DataFrame:
    """(replicate, nest, group_id, weight) for clusters crossed with training
    seeds (`pairs`: one row per observed (nest, group_id)): the same authors
    or canaries are read under every seed, so each replicate draws the seeds
    with replacement and the clusters with replacement, and a (seed, cluster)
    cell weighs the product of the two counts (a two-way bootstrap).  The
    clusters are drawn exactly as `cluster_weights` draws them, so one seed
    gives the un-nested interval to the bit."""
    clusters = cluster_weights(pairs["group_id"].to_list(), n_boot, seed)
    seeds = sorted(pairs["nest"].unique().to_list())
    counts = np.random.default_rng([seed, len(seeds)]).multinomial(
        len(seeds), np.full(len(seeds), 1.0 / len(seeds)), size=n_boot) if len(seeds) > 1 else \
        np.ones((n_boot, 1), dtype=np.int64)
    drawn = pl.DataFrame(
        {"replicate": np.repeat(np.arange(n_boot, dtype=np.int32), len(seeds)),
         "nest": pl.Series(seeds * n_boot, dtype=pairs.schema["nest"]), "seed_weight": counts.ravel().astype(np.int32)},
        schema={"replicate": pl.Int32, "nest": pairs.schema["nest"], "seed_weight": pl.Int32},
    ).filter(pl.col("seed_weight") > 0)
    return (drawn.join(clusters, on="replicate")
            .join(pairs.select("nest", "group_id"), on=["nest", "group_id"], how="semi")
            .select("replicate", "nest", "group_id", weight=pl.col("seed_weight") * pl.col("weight")))


class MissingValuesError(ValueError):
    """A rate's input has missing values; the message names where."""


def check_no_nulls(items: pl.DataFrame, keys: Sequence[str], values: Sequence[str], table: str) -> None:
    """Refuse null observations in any of `values`, naming the table, the
    column, how many rows and (up to five of) the groups they fall in."""
    for value in values:
        missing = items.filter(pl.col(value).is_null())
        if missing.height:
            groups = missing.select(keys).unique(maintain_order=True).head(5).rows() if keys else []
            raise MissingValuesError(
                f"table `{table}`, column `{value}`: {missing.height} of {items.height} observations are "
                f"missing (groups {list(keys)}: {groups}); the records that should hold them are absent or "
                "incomplete: re-run the probe passes of those variants (see docs on re-runs)"
            )


def rates_with_ci(
    items: pl.DataFrame,
    keys: Sequence[str],
    values: Sequence[str],
    n_boot: int,
    seed: int,
    derive: Derive | None = None,
    level: float = 0.95,
    *,
    table: str,
    nest: str | None = None,
) -> pl.DataFrame:
    """Mean of each `values` column per `keys` group, with percentile CIs from a
    cluster bootstrap over `group_id`.

    `items` has one row per observation (boolean or numeric values).  `derive`
    adds columns computed from the rates (a gap, a Delta); it is applied to
    the point estimates and to every replicate alike, so derived columns get
    intervals too.  Each rate `x` gains `x_lo` and `x_hi`.

    A missing value is refused, naming `table`, the column and the groups
    that lack it: a rate over the rows that happen to be present (or one that
    counts a missing row as a miss) is a different number from the one the
    table promises, and the records that should hold it are what to fix.

    With `nest` (a column naming each row's training seed), seeds are
    resampled as well as clusters (`crossed_weights`): a group that pools
    seeds gets a two-level interval.
    """
    keys, values = list(keys), list(values)
    check_no_nulls(items, keys, values, table)
    cluster = ["group_id"] if nest is None else ["nest", "group_id"]
    if nest is not None:
        items = items.with_columns(nest=pl.col(nest))
    derive = derive or (lambda frame: frame)
    per_cluster = items.group_by(*keys, *cluster).agg(
        n=pl.len(), **{v: pl.col(v).cast(pl.Float64).sum() for v in values}
    )
    point = derive(
        per_cluster.group_by(keys).agg(
            n=pl.col("n").sum(), **{v: pl.col(v).sum() / pl.col("n").sum() for v in values}
        )
    )
    weights = (cluster_weights(per_cluster["group_id"].to_list(), n_boot, seed) if nest is None
               else crossed_weights(per_cluster.select(*cluster).unique(), n_boot, seed))
    replicates = derive(
        per_cluster.join(weights, on=cluster)
        .group_by(*keys, "replicate")
        .agg(**{
            v: (pl.col(v) * pl.col("weight")).sum() / (pl.col("n") * pl.col("weight")).sum() for v in values
        })
    )
    metrics = [c for c in point.columns if c not in keys and c != "n"]
    tail = (1.0 - level) / 2.0
    bounds = replicates.group_by(keys).agg(
        *(pl.col(m).quantile(tail, "linear").alias(f"{m}_lo") for m in metrics),
        *(pl.col(m).quantile(1.0 - tail, "linear").alias(f"{m}_hi") for m in metrics),
    )
    ordered = [*keys, "n", *(c for m in metrics for c in (m, f"{m}_lo", f"{m}_hi"))]
    return point.join(bounds, on=keys, how="left").select(ordered).sort(keys)

"""Paper B's views: every probe of a bSFT cell side by side, and the
disagreement detector that names why they disagree.

A *cell* is a change to a merged canary base (a bSFT adapter of one source
and training length, stacked or merged, or a control); each cell runs once
per bSFT seed.  For every cell the probes are, against the cell's reference
(the merged base it started from), on the same canaries:

- windowed Delta NLL over the first K scored tokens (paper B's mean20),
- secret-span Delta NLL over the whole hex secret,
- behavioural hit@1 (greedy) and hit@k (k sampled decodes),
- the decoy contrast: secret Delta minus the Delta of the shuffled-hex and
  wrong-secret decoys behind the same preamble.

The windowed Delta decomposes exactly into the parts that come from preamble,
secret and suffix tokens inside the window, and the secret-span Delta into
its parts inside and past the window: the evidence behind each diagnosis.
Everything is computed from token and decode records; K, the thresholds and
the bootstrap are view parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from canary_audit.core.records import HEX_SETS
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.metrics import hex_hits, per_item_nll, token_deltas, with_parent
from canary_audit.views.paper_a import Bootstrap

HEX, DECOYS = HEX_SETS[0], HEX_SETS[1:]
SPAN_CLASS = {"prompt": "preamble", "head": "preamble", "secret": "secret", "continuation": "suffix"}
# A cell is judged per model and canary modality (image canaries and text
# canaries of a vision-language model are two rows).
CELL_KEYS = ("model", "modality", "canary_seed", "cell", "kind", "source", "step", "application")
WITH_CI = ("delta_window", "delta_secret", "delta_hit1", "delta_hitk", "decoy_contrast")
MEANS = (
    "window_preamble", "window_secret", "window_suffix", "secret_in_window", "secret_past_k",
    "hit1", "ref_hit1", "hitk", "ref_hitk", "decoy_delta_window", "decoy_delta_secret",
)
# Paper B's three case studies, in its order (C3, C4, C5): the detector's diagnoses.
WINDOW_TRUNCATION, SPAN_DRIFT, UNDERTRAINED = "window truncation", "non-secret span drift", "undertrained ambiguity"
DIAGNOSES = (WINDOW_TRUNCATION, SPAN_DRIFT, UNDERTRAINED)


@dataclass(frozen=True)
class Verdicts:
    """Thresholds at which a probe's Delta counts as a change (config
    `tables.verdicts`): NLL Deltas in nats per token, hit rates as shares."""

    delta_nll: float = 0.005
    hit_rate: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.delta_nll <= 10:
            raise ValueError(f"tables.verdicts.delta_nll = {self.delta_nll}: must be in (0, 10]")
        if not 0 < self.hit_rate <= 1:
            raise ValueError(f"tables.verdicts.hit_rate = {self.hit_rate}: must be in (0, 1]")


def cell_frame(cells: dict[str, dict]) -> pl.DataFrame:
    """model/variant -> cell fields, as a frame joined onto every record."""
    rows = [{"variant": v, **c} for v, c in cells.items()]
    schema = {"variant": pl.Utf8, "model": pl.Utf8, "cell": pl.Utf8, "kind": pl.Utf8, "source": pl.Utf8,
              "step": pl.Int64, "application": pl.Utf8, "bsft_seed": pl.Int64, "canary_seed": pl.Int64}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def position_frame(tokens: pl.DataFrame, parents: dict[str, str]) -> pl.DataFrame:
    """Per scored hex-canary token with a parent: its Delta NLL (see
    `token_deltas`) and its span class (preamble / secret / suffix)."""
    return token_deltas(tokens, parents, [HEX]).with_columns(
        span_class=pl.col("span").replace_strict(SPAN_CLASS, default="preamble")
    )


def item_frame(tokens: pl.DataFrame, decode: pl.DataFrame, parents: dict[str, str], window_k: int,
               positions: pl.DataFrame) -> pl.DataFrame:
    """One row per (variant, hex canary) of every variant with a parent: each
    probe's value and Delta, the window/secret decomposition (from
    `positions`, the `position_frame` of the same records), and the decoys."""
    nll = with_parent(
        per_item_nll(tokens.filter(pl.col("probe_set").is_in(HEX_SETS)), window_k), parents,
        ["probe_set", "modality", "item_id"], {"nll_window": "ref_window", "nll_secret": "ref_secret"},
    ).filter(pl.col("parent").is_not_null()).with_columns(
        delta_window=pl.col("nll_window") - pl.col("ref_window"),
        delta_secret=pl.col("nll_secret") - pl.col("ref_secret"),
    )
    secret = nll.filter(pl.col("probe_set") == HEX).select(
        "variant", "parent", "item_id", "modality", "delta_window", "delta_secret"
    )
    decoys = (
        nll.filter(pl.col("probe_set").is_in(DECOYS))
        .group_by("variant", "item_id")
        .agg(decoy_delta_window=pl.col("delta_window").mean(), decoy_delta_secret=pl.col("delta_secret").mean())
    )
    in_window = pl.col("position") <= window_k
    parts = positions.group_by("variant", "item_id").agg(
        **{
            f"window_{c}": pl.col("delta").filter(in_window & (pl.col("span_class") == c)).sum()
            / in_window.sum()
            for c in ("preamble", "secret", "suffix")
        },
        secret_in_window=pl.col("delta").filter(in_window & (pl.col("span") == "secret")).sum()
        / (pl.col("span") == "secret").sum(),
        secret_past_k=pl.col("delta").filter(~in_window & (pl.col("span") == "secret")).sum()
        / (pl.col("span") == "secret").sum(),
    )
    hits = hex_hits(decode).select("variant", "item_id", "hit1", "hitk")
    hits = with_parent(hits, parents, ["item_id"], {"hit1": "ref_hit1", "hitk": "ref_hitk"}).drop("parent")
    return (
        secret.join(parts, on=["variant", "item_id"], how="left")
        .join(decoys, on=["variant", "item_id"], how="left")
        .join(hits, on=["variant", "item_id"], how="left")
        .with_columns(
            delta_hit1=pl.col("hit1") - pl.col("ref_hit1"),
            delta_hitk=pl.col("hitk") - pl.col("ref_hitk"),
            decoy_contrast=pl.col("delta_secret") - pl.col("decoy_delta_secret"),
            group_id=pl.col("item_id"),
        )
    )


# Each probe's reading of a change, as the direction it says the secret moved:
# NLL up and hit rate down both say "forgotten", NLL down and hit rate up
# "strengthened", a flat NLL and a kept hit rate "no change".
DIRECTION = {
    "nll": {"up": "forgotten", "down": "strengthened", "flat": "unchanged"},
    "hit": {"down": "forgotten", "up": "strengthened", "kept": "unchanged"},
}
INCONCLUSIVE = "inconclusive"
# The probes whose directions must agree (hit@k only where samples were drawn).
AGREEMENT_PROBES = {"window": "nll", "secret": "nll", "hit1": "hit", "hitk": "hit"}


def _band(value: pl.Expr, t: float, kind: str) -> pl.Expr:
    """The verdict a single number reads as: up/down past the threshold `t`,
    flat (NLL) or kept (hit rate) inside it."""
    inside = "flat" if kind == "nll" else "kept"
    return pl.when(value >= t).then(pl.lit("up")).when(value <= -t).then(pl.lit("down")).otherwise(pl.lit(inside))


def _verdict(frame: pl.DataFrame, col: str, t: float, kind: str) -> pl.Expr:
    """A probe's verdict from its point estimate and, where the frame holds
    them, its CI bounds: `inconclusive` when the interval reaches into another
    band than the point (it straddles a threshold); null when the probe was
    not measured."""
    point = _band(pl.col(col), t, kind)
    verdict = point
    if f"{col}_lo" in frame.columns:
        same = (_band(pl.col(f"{col}_lo"), t, kind) == point) & (_band(pl.col(f"{col}_hi"), t, kind) == point)
        verdict = pl.when(same).then(point).otherwise(pl.lit(INCONCLUSIVE))
    return pl.when(pl.col(col).is_null()).then(pl.lit(None, pl.Utf8)).otherwise(verdict)


def _direction(verdict: str, kind: str) -> pl.Expr:
    return pl.col(verdict).replace_strict(DIRECTION[kind], default=None, return_dtype=pl.Utf8)


def with_verdicts(frame: pl.DataFrame, v: Verdicts) -> pl.DataFrame:
    """Each probe's verdict, and the diagnosis of the cell.

    `point_diagnosis` reads the point estimates: `agree` when every probe
    (windowed NLL, secret-span NLL, hit@1, and hit@k where sampled; a hit
    rate at 0 on both weights has no vote) points the same way (all say
    forgotten, all strengthened, or all unchanged), one of the three named
    disagreements (paper B's case studies), or `unexplained disagreement`.
    `diagnosis` is that reading when every probe it rests on is conclusive,
    and `inconclusive` when a probe's CI straddles its threshold
    (`inconclusive_probes` names them).
    """
    frame = frame.with_columns(
        v_window=_verdict(frame, "delta_window", v.delta_nll, "nll"),
        v_secret=_verdict(frame, "delta_secret", v.delta_nll, "nll"),
        v_hit1=_verdict(frame, "delta_hit1", v.hit_rate, "hit"),
        v_hitk=_verdict(frame, "delta_hitk", v.hit_rate, "hit"),
        v_decoy=_verdict(frame, "decoy_contrast", v.delta_nll, "nll"),
        p_window=_band(pl.col("delta_window"), v.delta_nll, "nll"),
        p_secret=_band(pl.col("delta_secret"), v.delta_nll, "nll"),
        p_hit1=_band(pl.col("delta_hit1"), v.hit_rate, "hit"),
        p_hitk=pl.when(pl.col("delta_hitk").is_not_null()).then(_band(pl.col("delta_hitk"), v.hit_rate, "hit")),
    )
    dirs = {probe: _direction(f"p_{probe}", kind) for probe, kind in AGREEMENT_PROBES.items()}
    # A hit rate that was 0 on the reference and stays 0 cannot register
    # forgetting (no canary to lose): it casts no vote, rather than a "kept"
    # that would contradict NLL probes on an undertrained cell.
    for probe, kind in AGREEMENT_PROBES.items():
        if kind == "hit" and {probe, f"ref_{probe}"} <= set(frame.columns):
            floor = (pl.col(f"ref_{probe}") == 0) & (pl.col(probe) == 0)
            dirs[probe] = pl.when(floor).then(pl.lit(None, pl.Utf8)).otherwise(dirs[probe])
    window, *others = dirs.values()
    agree = pl.lit(True)
    for d in others:
        agree = agree & (d.is_null() | (d == window))
    w, s, h = pl.col("p_window"), pl.col("p_secret"), pl.col("p_hit1")
    point = (
        pl.when(agree).then(pl.lit("agree"))
        .when((w == "flat") & (s == "up") & (h == "down")).then(pl.lit(DIAGNOSES[0]))
        .when((w == "up") & (s == "flat") & (h == "kept")).then(pl.lit(DIAGNOSES[1]))
        .when((w == "down") & (s == "up") & (pl.col("hit1") == 0) & (pl.col("ref_hit1") == 0))
        .then(pl.lit(DIAGNOSES[2]))
        .otherwise(pl.lit("unexplained disagreement"))
    )
    unsure = pl.concat_list(
        *(pl.when(pl.col(f"v_{probe}") == INCONCLUSIVE).then(pl.lit(probe)) for probe in AGREEMENT_PROBES)
    ).list.drop_nulls().list.join(", ")
    return frame.with_columns(point_diagnosis=point, inconclusive_probes=unsure).with_columns(
        diagnosis=pl.when(pl.col("inconclusive_probes") == "").then(pl.col("point_diagnosis"))
        .otherwise(pl.lit(INCONCLUSIVE))
    ).drop("p_window", "p_secret", "p_hit1", "p_hitk")


def _shares(frame: pl.DataFrame) -> pl.DataFrame:
    """Evidence fields: the preamble's share of the windowed movement, the
    share of the secret-span Delta that sits past the window, and how far the
    decoys move relative to the secret."""
    window_abs = sum(pl.col(f"window_{c}").abs() for c in ("preamble", "secret", "suffix"))
    secret_abs = pl.col("secret_in_window").abs() + pl.col("secret_past_k").abs()
    return frame.with_columns(
        preamble_share=pl.when(window_abs > 0).then(pl.col("window_preamble").abs() / window_abs),
        past_k_share=pl.when(secret_abs > 0).then(pl.col("secret_past_k").abs() / secret_abs),
        decoy_ratio=pl.when(pl.col("delta_secret") != 0).then(pl.col("decoy_delta_secret") / pl.col("delta_secret")),
    ).with_columns(
        # Whether the named mechanism's evidence holds (a pattern can match by
        # cancellation): truncation needs most secret damage past K, drift
        # most window movement in the preamble.  Undertrained ambiguity is the
        # pattern itself; its evidence (the decoys) resolves it either way.
        evidence_supports=pl.when(pl.col("point_diagnosis") == DIAGNOSES[0]).then(pl.col("past_k_share") >= 0.5)
        .when(pl.col("point_diagnosis") == DIAGNOSES[1]).then(pl.col("preamble_share") >= 0.5)
        .when(pl.col("point_diagnosis") == DIAGNOSES[2]).then(pl.lit(True))
    )


def _past_k_positions(positions: pl.DataFrame, keys: list[str], window_k: int, t: float) -> pl.DataFrame:
    """Per row: the secret positions past K whose mean Delta reaches the
    threshold, largest first (at most three), as `p23 (+0.41)`."""
    return (
        positions.filter((pl.col("span") == "secret") & (pl.col("position") > window_k))
        .group_by(*keys, "position")
        .agg(delta=pl.col("delta").mean())
        .filter(pl.col("delta") >= t)
        .sort(pl.col("delta"), descending=True)
        .group_by(keys, maintain_order=True)
        .agg(past_k_positions=pl.format("p{} (+{})", pl.col("position"), pl.col("delta").round(4)).head(3)
             .str.join(", "))
    )


def _evidence(frame: pl.DataFrame, window_k: int) -> pl.DataFrame:
    """One sentence per row with the numbers its diagnosis rests on."""
    def text(row: dict) -> str:
        reading = pattern(row)
        if row["diagnosis"] != INCONCLUSIVE:
            return reading
        unsure = ", ".join(
            f"{probe} ({row[f'delta_{probe}']:+.4f}, CI [{row[f'delta_{probe}_lo']:+.4f}, "
            f"{row[f'delta_{probe}_hi']:+.4f}])" for probe in row["inconclusive_probes"].split(", ")
        )
        return (f"inconclusive: the point estimates read `{row['point_diagnosis']}`, but the CI of {unsure} "
                f"straddles its threshold" + (f"; {reading}" if reading else ""))

    def pattern(row: dict) -> str:
        d = row["point_diagnosis"]
        if d == DIAGNOSES[0]:
            where = row.get("past_k_positions") or "none above threshold"
            text = (f"{row['past_k_share']:.0%} of the secret-span Delta sits past K={window_k} "
                    f"(positions: {where}); hit@1 {row['ref_hit1']:.2f} -> {row['hit1']:.2f}")
            if not row["evidence_supports"]:
                text += ("; most of the secret-span movement is inside the window, so truncation alone "
                         "does not explain it")
            return text
        if d == DIAGNOSES[1]:
            text = (f"preamble tokens carry {row['preamble_share']:.0%} of the windowed movement "
                    f"({row['window_preamble']:+.4f} of {row['delta_window']:+.4f}); secret span "
                    f"{row['delta_secret']:+.4f}; hit@1 kept at {row['hit1']:.2f}")
            if not row["evidence_supports"]:
                text += (f"; not preamble-driven: the in-window secret tokens moved {row['window_secret']:+.4f} "
                         f"and the secret tail past K {row['secret_past_k']:+.4f}, cancelling over the span")
            return text
        if d == DIAGNOSES[2]:
            ratio = row["decoy_ratio"]
            moved = "decoys move as much: format-prior smoothing, not secret-specific" if (
                ratio is not None and ratio >= 0.5) else "decoys move less: secret-specific"
            return (f"decoy contrast {row['decoy_contrast']:+.4f} (decoys {row['decoy_delta_secret']:+.4f} "
                    f"vs secret {row['delta_secret']:+.4f}); {moved}; hit@1 = 0 on both weights")
        if d == "agree":
            return ""
        hitk = f", hit@k {row['v_hitk']}" if row["v_hitk"] is not None else ""
        return (f"window {row['v_window']}, secret {row['v_secret']}, hit@1 {row['v_hit1']}{hitk}: "
                "a pattern none of the three named mechanisms explains")
    return frame.with_columns(
        evidence=pl.Series([text(r) for r in frame.iter_rows(named=True)], dtype=pl.Utf8)
    )


def cell_probes(tokens: pl.DataFrame, decode: pl.DataFrame, parents: dict[str, str], cells: dict[str, dict],
                window_k: int, verdicts: Verdicts, boot: Bootstrap) -> dict[str, pl.DataFrame]:
    """Every probe of every cell with CIs (canary-clustered bootstrap), its
    verdicts, diagnosis and evidence, at two levels from one pass over the
    records: `runs`, one row per seed-level run, and `cells`, one row per cell
    with its bSFT seeds pooled (seeds and canaries both resampled, crossed: a
    canary's seeds move together, and a seed that reverses a Delta widens
    its CI).  Empty frames when there are no cells."""
    empty = {"runs": pl.DataFrame(), "cells": pl.DataFrame()}
    cell_rows = cell_frame(cells)
    if cell_rows.is_empty() or tokens.is_empty():
        return empty
    positions = position_frame(tokens, parents).join(cell_rows, on="variant", how="inner")
    items = item_frame(tokens, decode, parents, window_k, positions).join(cell_rows, on="variant", how="inner")
    if items.is_empty():
        return empty
    with_ci = [c for c in WITH_CI if items[c].null_count() < items.height]

    def ci_of(part: pl.DataFrame, keys: list[str], nest: str | None) -> pl.DataFrame:
        return rates_with_ci(part, keys, with_ci, boot.replicates, boot.seed, level=boot.level, table="bsft_matrix",
                             nest=nest)

    def level(keys: list[str]) -> pl.DataFrame:
        if "bsft_seed" in keys:
            ci = ci_of(items, keys, None)
        else:
            # Seeds are resampled only for the cells that pool several: a cell run under one bSFT seed (a
            # planted control) gets its canaries' bootstrap alone, not draws of seeds it was never run under.
            several = pl.col("bsft_seed").n_unique().over(CELL_KEYS) > 1
            ci = pl.concat([ci_of(part, keys, nest) for part, nest in
                            ((items.filter(several), "bsft_seed"), (items.filter(~several), None)) if part.height],
                           how="diagonal_relaxed")
        unmeasured = [c for c in WITH_CI if c not in with_ci]  # all null: no CI, a null column
        means = items.group_by(keys).agg(*(pl.col(c).mean() for c in (*MEANS, *unmeasured)),
                                         seeds=pl.col("bsft_seed").n_unique())
        frame = _shares(with_verdicts(ci.join(means, on=keys, how="left"), verdicts))
        frame = frame.join(_past_k_positions(positions, keys, window_k, verdicts.delta_nll), on=keys, how="left")
        return _evidence(frame, window_k).with_columns(window_k=pl.lit(window_k)).sort(keys)

    return {"runs": level(["variant", *CELL_KEYS, "bsft_seed"]), "cells": level(list(CELL_KEYS))}

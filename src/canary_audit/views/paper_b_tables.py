"""Paper B's cells as its tables show them: the cell x probe matrix, the span
decomposition behind each diagnosis, merged against stacked, and the three
case studies as this grid finds them (the cells: views/paper_b.py)."""

from __future__ import annotations

import polars as pl

from canary_audit.views.paper_b import CELL_KEYS, DIAGNOSES


def decomposition(cells: pl.DataFrame) -> pl.DataFrame:
    """Where each cell's windowed and secret-span Deltas come from."""
    if cells.is_empty():
        return cells
    return cells.select(
        *CELL_KEYS, "delta_window", "window_preamble", "window_secret", "window_suffix", "preamble_share",
        "delta_secret", "secret_in_window", "secret_past_k", "past_k_share", "past_k_positions", "window_k",
    )


def matrix(cells: pl.DataFrame) -> pl.DataFrame:
    """The cell x probe matrix: each probe's Delta and verdict, the diagnosis
    and its evidence."""
    if cells.is_empty():
        return cells
    return cells.select(
        *CELL_KEYS, "seeds", "delta_window", "delta_window_lo", "delta_window_hi", "v_window", "delta_secret",
        "delta_secret_lo", "delta_secret_hi", "v_secret", "ref_hit1", "hit1", "delta_hit1", "delta_hit1_lo",
        "delta_hit1_hi", "v_hit1", "ref_hitk", "hitk", "v_hitk", "decoy_contrast", "v_decoy", "point_diagnosis",
        "inconclusive_probes", "diagnosis", "evidence_supports", "evidence",
    )


def merged_vs_stacked(cells: pl.DataFrame, precision: dict[str, str]) -> pl.DataFrame:
    """Per source and training length: each probe under the stacked and the
    merged application of the same adapters, and merged minus stacked, with
    the precision the model's merges round into (`precision`: model ->
    dtype).  Paper B's C4 evidence is what a merge rounds away; in float32
    nothing of a LoRA update rounds away, so there the two applications
    differ by float noise alone and the `note` says the row cannot show C4."""
    bsft = cells.filter(pl.col("kind") == "bsft") if cells.height else cells
    if bsft.is_empty() or bsft["application"].n_unique() < 2:
        return pl.DataFrame()
    values = ["delta_window", "delta_secret", "hit1", "diagnosis"]
    wide = bsft.pivot(on="application", index=["model", "modality", "canary_seed", "source", "step"],
                      values=values)
    merge = pl.col("model").replace_strict(precision, default=None)
    return wide.with_columns(
        **{f"{v}_merged_minus_stacked": pl.col(f"{v}_merged") - pl.col(f"{v}_stacked")
           for v in ("delta_window", "delta_secret", "hit1")},
        merge_precision=merge,
        note=pl.when(merge.is_null()).then(pl.lit("merge precision unknown: the view config does not record it "
                                                  "(re-tabulate with the workflow's view_config.json)"))
        .when(merge == "float32").then(pl.format(
            "a float32 merge keeps the whole update: merged and stacked differ by float noise, no C4 evidence "
            "(set models.{}.merge_dtype: bfloat16)", pl.col("model"))).otherwise(pl.lit("")),
    ).sort("model", "modality", "canary_seed", "source", "step")


def case_studies(cells: pl.DataFrame, window_k: int) -> pl.DataFrame:
    """Rows in the form of paper B's three case studies: per named diagnosis,
    each cell that shows it (observation, mechanism evidence), or one row
    saying it was not observed in this grid."""
    rows = []
    for case, diagnosis in enumerate(DIAGNOSES, start=1):
        found = cells.filter(pl.col("diagnosis") == diagnosis) if cells.height else cells
        if found.is_empty():
            rows.append({"case": case, "diagnosis": diagnosis, "cell": None, "observation": "not observed in this grid",
                         "evidence": None})
            continue
        for r in found.iter_rows(named=True):
            rows.append({
                "case": case, "diagnosis": diagnosis,
                "cell": f"{r['model']} {r['modality']} canaries: {r['cell']} (canary seed {r['canary_seed']})",
                "observation": (f"mean{window_k} Delta {r['delta_window']:+.4f} ({r['v_window']}), secret Delta "
                                f"{r['delta_secret']:+.4f} ({r['v_secret']}), hit@1 {r['ref_hit1']:.2f} -> "
                                f"{r['hit1']:.2f}"),
                "evidence": r["evidence"],
            })
    return pl.DataFrame(rows, schema={"case": pl.Int64, "diagnosis": pl.Utf8, "cell": pl.Utf8,
                                      "observation": pl.Utf8, "evidence": pl.Utf8})

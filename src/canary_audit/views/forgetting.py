"""How far each measure moved: for every variant with a never-trained
reference (every unlearning checkpoint and its memorization adapter, the
canary LoRA and every bSFT cell), the papers' probes beside the field's
measures, each with its Delta against the variant's parent, in one row per
(variant, family, modality, arm).

A view of the other views' tables, so each number here is the one its own
table reports (one definition each):

- the papers' behavioural probe: for the author canaries paper A's `out_acc`
  (canary leaked in the answer, AUTO arm, table `canary_leakage`), for the
  hex canaries paper B's greedy hit@1 (table `hex_recall`);
- the teacher-forced secret-span NLL (tables `nll` / `teacher_forced`);
- exact memorization and extraction strength (table `extraction`);
- exposure by rank interpolation (hex canaries; table `exposure`);
- the LOSS and Min-K%++ membership-inference AUCs (table `mia`);
- PrivLeak under Min-K% (MUSE's attack) with its CI and the KS forget
  quality (table `privacy`).
"""

from __future__ import annotations

import polars as pl

from canary_audit.core.records import AUTO, MIA_POPULATIONS
from canary_audit.views.metrics import with_parent

ROW = ["variant", "population", "modality", "arm"]
# The behavioural probe paper A and paper B report per canary family.
PAPER_PROBE = {"author": "out_acc (AUTO arm, answer)", "hex": "hit_at_1 (greedy)"}


def _with_delta(frame: pl.DataFrame, keys: list[str], values: list[str], parents: dict[str, str]) -> pl.DataFrame:
    """`values` per `keys` (variant first), each with `delta_<value>` against
    the row of the variant's parent on the same other keys."""
    own = with_parent(frame.select(*keys, *values), parents, keys[1:], {v: f"_p_{v}" for v in values})
    return own.select(
        *keys, *(c for v in values for c in (pl.col(v), (pl.col(v) - pl.col(f"_p_{v}")).alias(f"delta_{v}"))))


def forgetting_table(tables: dict[str, pl.DataFrame], parents: dict[str, str]) -> pl.DataFrame:
    """One row per privacy-table row (a variant with a reference, per family,
    modality and arm), joined with the other tables' figures and Deltas;
    empty without a privacy table."""
    privacy = tables.get("privacy")
    if privacy is None or privacy.is_empty():
        return pl.DataFrame()
    member_set = pl.col("population").replace_strict({f: pair[0] for f, pair in MIA_POPULATIONS.items()})
    out = privacy.select(
        *ROW, "reference", "members", "nonmembers", "privleak_min_k", "privleak_min_k_lo", "privleak_min_k_hi",
        "forget_quality", "shifted", probe_set=member_set,
        parent=pl.col("variant").replace_strict(parents, default=None),
        paper_probe=pl.col("population").replace_strict(PAPER_PROBE),
    )
    paper = []
    if (leak := tables.get("canary_leakage")) is not None and leak.height:
        # Author canaries are text: paper A's rate is per variant.
        paper.append(_with_delta(leak.filter(pl.col("arm") == AUTO), ["variant"], ["out_acc"], parents)
                     .select("variant", population=pl.lit("author"), modality=pl.lit("text"),
                             paper_value=pl.col("out_acc"), delta_paper_value=pl.col("delta_out_acc")))
    if (recall := tables.get("hex_recall")) is not None and recall.height:
        paper.append(_with_delta(recall, ["variant", "modality"], ["hit_at_1"], parents)
                     .select("variant", population=pl.lit("hex"), modality="modality",
                             paper_value=pl.col("hit_at_1"), delta_paper_value=pl.col("delta_hit_at_1")))
    if paper:
        out = out.join(pl.concat(paper, how="vertical_relaxed"), on=["variant", "population", "modality"],
                       how="left")
    else:  # no decode records: the behavioural probe was not run
        out = out.with_columns(paper_value=pl.lit(None, pl.Float64), delta_paper_value=pl.lit(None, pl.Float64))
    for name, values in (("nll", ["nll_secret", "delta_nll_secret"]),
                         ("extraction", ["exact_memorization", "delta_exact_memorization", "extraction_strength",
                                         "delta_extraction_strength"])):
        if (frame := tables.get(name)) is not None and frame.height:
            # (a table has no Delta columns when none of its variants has a parent)
            out = out.join(frame.select("variant", "probe_set", "arm", "modality",
                                        *(v for v in values if v in frame.columns)),
                           on=["variant", "probe_set", "arm", "modality"], how="left")
    if (exposure := tables.get("exposure")) is not None and exposure.height:
        values = [v for v in ("exposure_interpolation", "delta_exposure_interpolation") if v in exposure.columns]
        out = out.join(exposure.select("variant", "modality", *values, population=pl.lit("hex")),
                       on=["variant", "modality", "population"], how="left")
    if (mia := tables.get("mia")) is not None and mia.height:
        for attack in ("loss", "min_k_pp"):
            auc = _with_delta(mia.filter(pl.col("attack") == attack).rename({"auc": f"auc_{attack}"}), ROW,
                              [f"auc_{attack}"], parents)
            out = out.join(auc, on=ROW, how="left")
    lead = ["variant", "parent", "reference", *ROW[1:], "members", "nonmembers", "paper_probe", "paper_value",
            "delta_paper_value"]
    return out.drop("probe_set").select(*lead, pl.exclude(lead)).sort(ROW)

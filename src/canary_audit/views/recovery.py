"""The recovery table: each variant a recovery attack made beside the
variant it attacked, per author, with paired CIs.

A recovery attack (design/variants.py, config `recovery`) reads an unlearned
checkpoint again after an operation that should not restore what the
unlearning removed (weight quantization: model/quantize.py; budgeted
relearning, a few fine-tuning steps: train/relearn.py).  The attack is
run the same way on the checkpoint's memorized parent, whose attacked value
is the attack's ceiling (what the attack leaves of the memorization it would
restore), and on the never-trained reference, its negative (an attack that
"restores" canaries the reference never learnt is measuring the attack).

Every number comes from the seed x author layout (views/seeds.py,
`item_cells`): one value per author and variant, so a difference between
an attacked variant and its twin is paired by author and bootstrapped over
authors.  A relearning on a share of the forget set is read on the authors
it held out (`held_out`, applied to the records every table reads).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from canary_audit.data.planted_controls import CLEAN, FALSE_ALARM, MISSED, NOT_BUILT, SEEN
from canary_audit.data.relearn import ATTACK_PREFIX
from canary_audit.model.quantize import RECOVERY, RECOVERY_PLANT
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.mia import auc, bootstrap_draws
from canary_audit.views.paper_a import Bootstrap

# item_cells' columns: the AUTO arm's greedy answer (hit@1) and trace,
# teacher-forced top-1, and hit@k where the authors' canaries were sampled.
MEASURED = ("out_acc", "thk_leak", "tf_top1_rate", "hit_at_k")
MIA_MEASURE = "mia_auc_loss"  # the LOSS attack's AUC, author canaries against non-member authors (views/mia.py)
# A row's role: the attacked twin's kind (the unlearned checkpoint, its
# memorized parent: the ceiling, its reference: the negative), or a
# positive's rows: its plant before the attack, `clipped` (quantization:
# the unlearning's change clipped into the parent's bins, against the
# checkpoint: what the clip cost) or `suppressed` (relearning: the rank-1
# suppression LoRA, against the memorized parent: what it forgot), and
# `positive` (the plant attacked, against the plant: recovery by construction).
CLIPPED, SUPPRESSED, POSITIVE = "clipped", "suppressed", "positive"
ROLES = ("unlearned", "memorized", "reference", CLIPPED, SUPPRESSED, POSITIVE)
COLUMNS = {"model": pl.Utf8, "seed": pl.Int64, "template": pl.Utf8, "run": pl.Utf8, "k": pl.Int64,
           "attack": pl.Utf8, "steps": pl.Int64, "role": pl.Utf8, "variant": pl.Utf8, "twin": pl.Utf8,
           "measure": pl.Utf8,
           "n": pl.Int64, **{f"{c}{e}": pl.Float64 for c in ("before", "after", "delta") for e in ("", "_lo", "_hi")},
           **{f"{c}{e}": pl.Float64 for c in ("ceiling", "negative") for e in ("", "_lo", "_hi")},
           "testable": pl.Boolean, "control": pl.Utf8, "why": pl.Utf8,
           **{f"retain_{c}": pl.Float64 for c in ("before", "after")}}


def held_out(frame: pl.DataFrame, variants: dict[str, dict]) -> pl.DataFrame:
    """`frame` (records) without the items of the authors a `forget`
    relearning trained on, on its variants (variant field `relearned`):
    only the held-out rest is probed, since a relearned author answering
    again shows nothing.  Their twins keep every author; a paired view
    joins on the author and so compares the held-out ones alone."""
    dropped = [(name, v["relearned"]) for name, v in variants.items() if v.get("relearned")]
    if not dropped or not frame.height:
        return frame
    out = pl.DataFrame([(n, a) for n, ids in dropped for a in ids], schema=["variant", "author"], orient="row")
    # An author's items (canary and QA probes) carry its id as their group.
    return frame.join(out, left_on=["variant", "group_id"], right_on=["variant", "author"], how="anti")


def attacked(variants: dict[str, dict]) -> pl.DataFrame:
    """Each recovery variant with its twin (the variant it attacked), the
    twin's kind as its role and the attack's name."""
    def role(v: dict) -> str | None:
        if v.get("clip"):
            return POSITIVE if v.get("quantize") else CLIPPED
        if v.get("kind") == RECOVERY_PLANT:
            return POSITIVE if v.get("relearn") else SUPPRESSED
        return variants.get(v["parent"], {}).get("kind")

    def attack(name: str, v: dict) -> str | None:
        if v.get("relearn"):  # `<twin>.relearn-<data>-<template>-t<steps>`
            return name.removeprefix(f"{v['parent']}.")
        return v.get("quantize") or v.get("clip")

    rows = [{"variant": name, "twin": v["parent"], "attack": attack(name, v), "steps": v.get("relearn_steps"),
             "role": role(v), "model": v.get("model", name.split("/")[0]),
             "seed": v.get("seed"), "template": v.get("template"), "run": v.get("run"), "k": v.get("k")}
            for name, v in variants.items() if v.get("kind") in (RECOVERY, RECOVERY_PLANT) and v.get("parent")]
    return pl.DataFrame(rows, schema={"variant": pl.Utf8, "twin": pl.Utf8, "attack": pl.Utf8, "steps": pl.Int64,
                                      "role": pl.Utf8,
                                      "model": pl.Utf8, "seed": pl.Int64, "template": pl.Utf8, "run": pl.Utf8,
                                      "k": pl.Int64})


def mia_rates(scores: pl.DataFrame, pairs: pl.DataFrame, boot: Bootstrap, arm: str) -> pl.DataFrame:
    """The LOSS attack's AUC on the authors' canaries (members) against the
    non-member authors, under prefill `arm` (views/mia.py), of each attacked
    variant (`after`) and its twin (`before`), over the items both hold (a
    relearning on a share of the authors is read on the rest), with their
    difference: members and non-members resampled independently, the same
    draws for both sides, so the difference's CI is paired."""
    chosen = scores.filter((pl.col("population") == "author") & (pl.col("arm") == arm))
    rows = []
    for variant, twin in pairs.select("variant", "twin").iter_rows():
        sides = [chosen.filter(pl.col("variant") == v).select("probe_set", "item_id", "member", "loss")
                 for v in (twin, variant)]
        if any(side.is_empty() for side in sides):
            continue
        both = sides[0].join(sides[1], on=["probe_set", "item_id", "member"], suffix="_after").sort(
            "probe_set", "item_id")
        members, nonmembers = both.filter(pl.col("member")), both.filter(~pl.col("member"))
        if members.is_empty() or nonmembers.is_empty():
            continue
        pick_m, pick_n = bootstrap_draws(members.height, nonmembers.height, boot.replicates, boot.seed)
        point, draws = {}, {}
        for side, column in (("before", "loss"), ("after", "loss_after")):
            m, n = members[column].to_numpy(), nonmembers[column].to_numpy()
            point[side], draws[side] = float(auc(m[None], n[None])[0]), auc(m[pick_m], n[pick_n])
        point["delta"], draws["delta"] = point["after"] - point["before"], draws["after"] - draws["before"]
        tail = (1.0 - boot.level) / 2.0
        rows.append({"variant": variant, "measure": MIA_MEASURE, "n": members.height,
                     **{f"{k}{e}": v for k in point for e, v in (("", point[k]),
                                                                 ("_lo", float(np.quantile(draws[k], tail))),
                                                                 ("_hi", float(np.quantile(draws[k], 1 - tail))))}})
    return pl.DataFrame(rows)


def recovery_table(cells: pl.DataFrame, utility: pl.DataFrame | None, variants: dict[str, dict],
                   references: dict[str, dict], boot: Bootstrap, scores: pl.DataFrame | None = None,
                   arm: str = "prefill_bio") -> pl.DataFrame:
    """One row per (attacked variant, measure): the twin's value (`before`),
    the attacked one's (`after`) and their paired difference, each with its
    author-clustered CI.  An unlearned row carries the attacked parent's
    value (`ceiling`) and the attacked reference's (`negative`) under the
    same attack (`references`: the view config's variant -> its
    never-trained reference), and says whether the attack could show recovery there
    (`testable`: the ceiling's CI lies above the unlearned value's; where it
    reaches it, the attack on the memorized model alone already leaves no
    more than the unlearning did).  The attack's positive (the unlearning's
    change clipped into the parent's bins, attacked) reads `seen` where its
    paired CI lies above 0, the attacked reference `clean` where its does
    not (`control`).  Retain accuracy (AUTO arm) before and
    after stands beside every row: the attack's cost in utility.  With the
    MIA item `scores` (views/mia.item_scores), each pair also gets a row of
    the LOSS attack's AUC under prefill `arm` (`mia_rates`)."""
    pairs = attacked(variants)
    if not pairs.height or not cells.height:
        return pl.DataFrame(schema=COLUMNS)
    values = cells.filter(pl.col("column").is_in(MEASURED)).select("variant", "group_id", "column", "value")
    items = (pairs.select("variant", "twin")
             .join(values.rename({"value": "after"}), on="variant")
             .join(values.rename({"variant": "twin", "value": "before"}), on=["twin", "group_id", "column"])
             .rename({"column": "measure"}))
    rates = rates_with_ci(items, ["variant", "measure"], ["before", "after"], boot.replicates, boot.seed,
                          derive=lambda f: f.with_columns(delta=pl.col("after") - pl.col("before")),
                          level=boot.level, table="recovery")
    if scores is not None and scores.height:
        rates = pl.concat([rates, mia_rates(scores, pairs, boot, arm)], how="diagonal_relaxed")
    rows = pairs.join(rates, on="variant")
    # The same attack on the unlearned variant's parent and reference: its ceiling and its negative.
    parent_of = {n: v.get("parent") for n, v in variants.items()}
    reference_of = {n: r.get("reference") for n, r in references.items()}
    ends = rows.filter(pl.col("role").is_in(["memorized", "reference"])).select(
        "twin", "attack", "measure", *(f"after{e}" for e in ("", "_lo", "_hi")))
    rows = rows.with_columns(
        parent_twin=pl.col("twin").replace_strict(parent_of, default=None, return_dtype=pl.Utf8),
        reference_twin=pl.col("twin").replace_strict(reference_of, default=None, return_dtype=pl.Utf8))
    for side, key in (("ceiling", "parent_twin"), ("negative", "reference_twin")):
        rows = rows.join(ends.rename({"twin": key, **{f"after{e}": f"{side}{e}" for e in ("", "_lo", "_hi")}}),
                         on=[key, "attack", "measure"], how="left")
    unlearned = pl.col("role") == "unlearned"
    rows = rows.with_columns(pl.when(unlearned).then(pl.col(c)).alias(c)
                             for side in ("ceiling", "negative") for c in (side, f"{side}_lo", f"{side}_hi"))
    testable = pl.when(unlearned).then(pl.col("ceiling_lo") > pl.col("before_hi"))
    why = (pl.when(~unlearned).then(pl.lit(""))
           .when(pl.col("ceiling").is_null()).then(pl.lit("no attacked parent in this run"))
           .when(testable).then(pl.lit("the attacked parent's CI lies above the unlearned value's"))
           .otherwise(pl.format("not testable: the attacked parent's CI [{}, {}] reaches the unlearned value's "
                                "[{}, {}]; the attack on the memorized model leaves no more than the unlearning did",
                                *(pl.col(c).round(3) for c in ("ceiling_lo", "ceiling_hi", "before_lo", "before_hi")))))
    # The attack's planted controls: the positive must read a conclusive rise
    # (its paired CI above 0), the attacked reference none.  A positive whose
    # plant no longer forgets (its CI reaches the memorized parent's
    # unattacked value: the format's bins too narrow to hold the
    # unlearning's change, or a suppression too weak) is not built, not missed.
    parent = rows.filter(pl.col("role") == "memorized").select(
        pl.col("twin").alias("parent_name"), "attack", "measure", parent_lo="before_lo")
    clipped = rows.filter(pl.col("role") == CLIPPED).select(
        pl.col("variant").alias("twin"), "attack", "measure", plant_hi="after_hi",
        parent_name=pl.col("twin").replace_strict(parent_of, default=None)).join(
        parent, on=["parent_name", "attack", "measure"], how="left")
    suppressed = rows.filter(pl.col("role") == SUPPRESSED).select(
        pl.col("variant").alias("twin"), "measure", plant_hi="after_hi", parent_lo="before_lo")
    plants = pl.concat([clipped.select("twin", "measure", "plant_hi", "parent_lo"), suppressed])
    rows = rows.join(plants, on=["twin", "measure"], how="left")
    # A positive on a plant stacked on the memorized parent (the suppression)
    # needs what the attack leaves of that parent above the plant: where the
    # attacked parent reaches the plant's value (20 public steps wipe the
    # parent's own recall) nothing could rise, so it is not built either.
    attacked_parent = rows.filter(pl.col("role") == "memorized").select(
        pl.col("twin").alias("plant_parent"), "attack", "measure", parent_after_lo="after_lo")
    rows = rows.with_columns(plant_parent=pl.when(pl.col("role") == POSITIVE).then(
        pl.col("twin").replace_strict(parent_of, default=None))).join(
        attacked_parent, on=["plant_parent", "attack", "measure"], how="left")
    rise = pl.col("delta_lo") > 0
    built = (pl.col("plant_hi") < pl.col("parent_lo")) & (
        pl.col("parent_after_lo").is_null() | (pl.col("parent_after_lo") > pl.col("before_hi")))
    control = (pl.when((pl.col("role") == POSITIVE) & ~built).then(pl.lit(NOT_BUILT))
               .when(pl.col("role") == POSITIVE).then(pl.when(rise).then(pl.lit(SEEN)).otherwise(pl.lit(MISSED)))
               .when(pl.col("role") == "reference").then(pl.when(rise).then(pl.lit(FALSE_ALARM))
                                                         .otherwise(pl.lit(CLEAN))))
    plant_reads = pl.format("(the plant reads up to {} before the attack, the memorized parent from {})",
                            pl.col("plant_hi").round(3), pl.col("parent_lo").round(3))
    plant_forgets = pl.col("plant_hi") < pl.col("parent_lo")
    why = (pl.when((pl.col("role") == POSITIVE) & ~plant_forgets & pl.col("attack").str.starts_with(ATTACK_PREFIX))
           .then(pl.format("not built: the suppression plant does not forget {}", plant_reads))
           .when((pl.col("role") == POSITIVE) & plant_forgets & ~built)
           .then(pl.format("not built: the attack leaves the memorized parent from {}, no more than the plant's {} "
                           "before it: nothing it could restore", pl.col("parent_after_lo").round(3),
                           pl.col("before_hi").round(3)))
           .when((pl.col("role") == POSITIVE) & ~built)
           .then(pl.format("not built: clipped into {}'s bins the unlearning's change no longer forgets {}",
                           pl.col("attack"), plant_reads))
           .otherwise(why))
    # The plants are built on recall: no control reads the MIA rows (an unlearned model's AUC stays near 1).
    plant_read = pl.col("measure") != MIA_MEASURE
    rows = rows.with_columns(testable=testable, control=pl.when(plant_read).then(control),
                             why=pl.when(plant_read | (pl.col("role") == "unlearned")).then(why).otherwise(pl.lit("")))
    retain = _retain(utility)
    rows = (rows.join(retain.rename({"variant": "twin", "retain": "retain_before"}), on="twin", how="left")
            .join(retain.rename({"retain": "retain_after"}), on="variant", how="left"))
    order = {r: i for i, r in enumerate(ROLES)}
    return (rows.with_columns(pl.col("role").replace_strict(order, default=len(order)).alias("_order"))
            .sort("model", "seed", "attack", "template", "run", "k", "_order", "measure", nulls_last=True)
            .select([pl.col(c).cast(t) for c, t in COLUMNS.items()]))


def _retain(utility: pl.DataFrame | None) -> pl.DataFrame:
    """Retain accuracy per variant, AUTO arm (the utility table's)."""
    if utility is None or not utility.height:
        return pl.DataFrame(schema={"variant": pl.Utf8, "retain": pl.Float64})
    return utility.filter((pl.col("probe_set") == "retain") & (pl.col("arm") == "auto")).select(
        "variant", retain="accuracy")

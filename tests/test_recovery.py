"""The recovery table (views/recovery.py): an attacked variant beside its
twin, paired by author, with its ceiling and its negative."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml
from conftest import ROOT

from canary_audit.data.planted_controls import CLEAN, FALSE_ALARM, MISSED, NOT_BUILT, SEEN
from canary_audit.verdicts.controls import recovery_controls
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.recovery import recovery_table

AUTHORS = [f"a{i:03d}" for i in range(20)]
TWINS = {"tiny/mem-bio-s0": "memorized", "tiny/npo-bio-s0-k20": "unlearned", "tiny/reference-meta-s0": "reference"}


def _variants(fmt: str = "int4-row") -> dict[str, dict]:
    out = {name: {"kind": kind, "model": "tiny", "seed": 0, "template": "bio",
                  "parent": "tiny/mem-bio-s0" if kind == "unlearned" else "tiny/base"} for name, kind in TWINS.items()}
    for name in TWINS:
        out[f"{name}.{fmt}"] = {**out[name], "kind": "recovery", "parent": name, "quantize": fmt}
    return out


def _cells(values: dict[str, list[float]]) -> pl.DataFrame:
    return pl.DataFrame([{"variant": v, "group_id": a, "column": "out_acc", "n": 1, "value": x}
                         for v, xs in values.items() for a, x in zip(AUTHORS, xs, strict=True)])


def _table(values: dict[str, list[float]]) -> pl.DataFrame:
    references = {n: {"population": "author", "reference": "tiny/reference-meta-s0"}
                  for n in ("tiny/mem-bio-s0", "tiny/npo-bio-s0-k20")}
    utility = pl.DataFrame({"variant": list(values), "probe_set": "retain", "arm": "auto",
                            "accuracy": [0.9 - 0.1 * i for i in range(len(values))]})
    return recovery_table(_cells(values), utility, _variants(), references, Bootstrap(replicates=200))


def test_an_attack_that_restores_half_the_authors_reads_a_paired_rise_beside_its_ceiling_and_negative():
    ones, zeros, half = [1.0] * 20, [0.0] * 20, [1.0] * 10 + [0.0] * 10
    table = _table({"tiny/mem-bio-s0": ones, "tiny/npo-bio-s0-k20": zeros, "tiny/reference-meta-s0": zeros,
                    "tiny/mem-bio-s0.int4-row": ones, "tiny/npo-bio-s0-k20.int4-row": half,
                    "tiny/reference-meta-s0.int4-row": zeros})
    assert table["role"].to_list() == ["unlearned", "memorized", "reference"]
    row = table.row(0, named=True)
    assert (row["before"], row["after"], row["delta"]) == (0.0, 0.5, 0.5)
    assert 0.2 < row["delta_lo"] < 0.5 < row["delta_hi"] < 0.8
    assert (row["ceiling"], row["negative"], row["testable"]) == (1.0, 0.0, True)
    assert row["retain_before"] == pytest.approx(0.8) and row["retain_after"] == pytest.approx(0.5)
    assert table.filter(pl.col("role") != "unlearned")["testable"].to_list() == [None, None]


def test_an_attack_whose_parent_falls_to_the_unlearned_value_is_not_testable():
    ones, zeros, few = [1.0] * 20, [0.0] * 20, [1.0] * 2 + [0.0] * 18
    table = _table({"tiny/mem-bio-s0": ones, "tiny/npo-bio-s0-k20": few, "tiny/reference-meta-s0": zeros,
                    "tiny/mem-bio-s0.int4-row": few, "tiny/npo-bio-s0-k20.int4-row": few,
                    "tiny/reference-meta-s0.int4-row": zeros})
    row = table.row(0, named=True)
    assert row["testable"] is False and row["why"].startswith("not testable: the attacked parent's CI")
    assert row["delta"] == 0.0


RUN = ROOT / "tests" / "data" / "recovery_run"  # configs/recovery.yaml over the default's records: NPO's rows


def test_the_stored_runs_recovery_rows_are_a_view_of_its_item_cells():
    """The recovery table of a real run (NPO at K = 20, its parent and
    reference under int4-row and int8-row with the clipped plants, and
    relearned on 10% of the authors and on the public authors for 5 and 20
    steps beside the suppression plant) recomputed from its stored item
    cells; its readings: every attack testable but 20 public steps (they
    wipe the parent's own recall, the ceiling), the quantization positives
    and the forget relearning's `seen`, the 20-step public one `not built`
    (the attacked parent falls to the plant's value: nothing it could
    restore), every attacked reference `clean`."""
    config = json.loads((RUN / "view_config.json").read_text())
    table = recovery_table(pl.read_csv(RUN / "item_cells.csv"), pl.read_csv(RUN / "utility.csv"), config["variants"],
                           config["references"], Bootstrap(**config["bootstrap"]))
    stored = pl.read_csv(RUN / "recovery.csv", infer_schema_length=None)
    assert table.select("variant", "measure").rows() == stored.select("variant", "measure").rows()
    for column in ("before", "after", "delta", "delta_lo", "delta_hi", "ceiling", "negative"):
        assert table[column].to_list() == pytest.approx(stored[column].to_list(), abs=1e-9, nan_ok=True), column
    assert table["control"].to_list() == stored["control"].to_list()
    out_acc = table.filter(pl.col("measure") == "out_acc")
    testable = dict(out_acc.filter(pl.col("role") == "unlearned").select("attack", "testable").iter_rows())
    assert {a for a, t in testable.items() if not t} == {"relearn-public-bio-t20"}
    held = out_acc.filter(pl.col("attack").str.starts_with("relearn-forget"))
    assert set(held["n"]) == {36}  # the 4 relearned authors of 40 are not read
    controls = dict(out_acc.filter(pl.col("control").is_not_null()).select("variant", "control").iter_rows())
    positives = {v: c for v, c in controls.items() if "reference" not in v}
    assert positives == {"tiny/npo-bio-s0-k20.clip-int4-row.int4-row": SEEN,
                         "tiny/npo-bio-s0-k20.clip-int8-row.int8-row": SEEN,
                         "tiny/mem-bio-s0.suppress.relearn-forget-bio-t5": SEEN,
                         "tiny/mem-bio-s0.suppress.relearn-forget-bio-t20": SEEN,
                         "tiny/mem-bio-s0.suppress.relearn-public-bio-t5": SEEN,
                         "tiny/mem-bio-s0.suppress.relearn-public-bio-t20": NOT_BUILT}
    assert {c for v, c in controls.items() if "reference" in v} == {CLEAN}
    rows = recovery_controls(table)
    assert rows.height == 6 and set(rows["negative_verdict"]) == {CLEAN}
    assert rows.filter(pl.col("positive").str.contains("suppress"))["claim"].unique().to_list() == [
        "relearning_recovery"]


def test_a_removed_recovery_plant_reads_missed_and_a_restoring_reference_a_false_alarm():
    """The attack's controls fail when their construction is taken away: a
    positive whose attacked plant reads what the plant read (no rise)
    is `missed`, a reference the attack lifts is a `false alarm`."""
    config = json.loads((RUN / "view_config.json").read_text())
    cells = pl.read_csv(RUN / "item_cells.csv")
    plant, attacked, ref = ("tiny/npo-bio-s0-k20.clip-int4-row", "tiny/npo-bio-s0-k20.clip-int4-row.int4-row",
                            "tiny/reference-meta-s0.int4-row")
    removed = pl.concat([cells.filter(pl.col("variant") != attacked),
                         cells.filter(pl.col("variant") == plant).with_columns(variant=pl.lit(attacked))])
    lifted = removed.with_columns(value=pl.when((pl.col("variant") == ref) & (pl.col("column") == "out_acc"))
                                  .then(1.0).otherwise(pl.col("value")))
    table = recovery_table(lifted, None, config["variants"], config["references"], Bootstrap(replicates=200))
    out_acc = dict(table.filter(pl.col("measure") == "out_acc").select("variant", "control").iter_rows())
    assert out_acc[attacked] == MISSED and out_acc[ref] == FALSE_ALARM


def test_recovery_claims_are_judged_like_any_claim():
    """configs/recovery.yaml's claims over the stored run: 20 relearning
    steps on 10% of the authors restore NPO's forgetting on the rest (a rise
    that holds); INT4 restores it (a rise the data do not show), NPO
    survives INT4 within 0.2 and 5 public steps leave it within 0.1 (bands
    that the CI meets only before Holm's adjustment over the file's four
    value claims, or not at all): inconclusive."""
    from canary_audit.verdicts.claims import parse
    from canary_audit.verdicts.judge import claims_table
    from canary_audit.verdicts.readings import Run

    claims = yaml.safe_load((ROOT / "configs" / "recovery.yaml").read_text())["claims"]
    table = claims_table(Run(RUN), parse(claims))
    assert dict(zip(table["id"], table["verdict"], strict=True)) == {
        "npo_survives_int4": "inconclusive", "int4_restores_npo": "inconclusive", "relearning_restores_npo": "holds",
        "public_relearning_leaves_npo": "inconclusive"}


def test_a_table_column_null_over_its_first_rows_reads_as_numbers(tmp_path):
    """A control's prefill arm is null on every audited variant and set on
    the plants, which come after them: with enough variants (a run with
    recovery attacks) the first hundred rows are null, and a reader that
    infers from them reads the column as text (the summary's CI format
    then fails).  read_table infers from every row."""
    from canary_audit.views.table import read_table, with_ci

    rows = 150 * [{"variant": "a", "prefill_own_trace": None, "prefill_own_trace_lo": None,
                   "prefill_own_trace_hi": None}] + [{"variant": "ctl", "prefill_own_trace": 0.5,
                                                      "prefill_own_trace_lo": 0.25, "prefill_own_trace_hi": 0.75}]
    pl.DataFrame(rows, infer_schema_length=None).write_csv(tmp_path / "prefill_arms.csv")
    frame = read_table(tmp_path / "prefill_arms.csv")
    assert frame.schema["prefill_own_trace"] == pl.Float64
    assert with_ci(frame, ["prefill_own_trace"])["prefill_own_trace"][-1] == "0.5 [0.25, 0.75]"
    (tmp_path / "empty.csv").write_text("")
    assert read_table(tmp_path / "empty.csv") is None and read_table(tmp_path / "none.csv") is None


def test_the_mia_row_pairs_the_loss_aucs_over_the_items_both_sides_hold():
    """Members (author canaries) and non-member authors scored by LOSS: the
    twin's AUC near 0.5 (scores that ignore membership), the attacked variant's
    1.0 (members above every non-member) on the items it holds (one member
    dropped, as a relearning drops its authors): the row reads its AUCs
    over the 9 shared members (19/36 -> 1.0), the paired difference's CI above 0."""
    from canary_audit.views.recovery import MIA_MEASURE, mia_rates

    rows = []
    for i in range(10):
        rows.append(("tiny/x", f"a{i:03d}", True, float(i % 2)))
        rows.append(("tiny/x", f"n{i:03d}", False, float(i % 2)))
        if i:
            rows.append(("tiny/x.attacked", f"a{i:03d}", True, 5.0 + i))
        rows.append(("tiny/x.attacked", f"n{i:03d}", False, -5.0 - i))
    scores = pl.DataFrame(rows, schema=["variant", "item_id", "member", "loss"], orient="row").with_columns(
        population=pl.lit("author"), arm=pl.lit("prefill_bio"),
        probe_set=pl.when(pl.col("member")).then(pl.lit("canary")).otherwise(pl.lit("author_nonmember")))
    pairs = pl.DataFrame({"variant": ["tiny/x.attacked"], "twin": ["tiny/x"]})
    row = mia_rates(scores, pairs, Bootstrap(replicates=200), "prefill_bio").row(0, named=True)
    assert (row["measure"], row["n"], row["before"], row["after"]) == (MIA_MEASURE, 9, pytest.approx(19 / 36), 1.0)
    assert row["delta_lo"] > 0 and row["after_lo"] == 1.0
    assert mia_rates(scores, pairs, Bootstrap(replicates=200), "prefill_meta").is_empty()


def test_an_attack_added_to_a_run_never_moves_a_papers_reading():
    """The papers' readings that pick or pool among the run's variants (the
    parser flip's worst variant, the head echo's fallback pool) read the
    audit's own arms: an attacked copy or a recovery plant is not one, so
    a quantized checkpoint that misses its closing tag more often than any
    arm is not the one the flip is read on."""
    from canary_audit.verdicts.readings import Run

    variants = json.loads((RUN / "view_config.json").read_text())["variants"]
    frame = pl.DataFrame({"variant": ["tiny/npo-bio-s0-k20", "tiny/npo-bio-s0-k20.int4-row",
                                      "tiny/mem-bio-s0.suppress"], "missing_close": [0.05, 0.45, 0.5]})
    run = Run(None, {"variants": variants}, {})
    assert run.audited(frame)["variant"].to_list() == ["tiny/npo-bio-s0-k20"]


def test_the_relearning_figures_docs_quote_are_the_stored_runs():
    """docs/measures.md ("What relearning shows here") quotes the stored
    run: NPO's held-out out_acc before and after 20 and 5 forget steps, the
    paired lower end, the ceiling and the public attack's figures."""
    import re

    text = re.sub(r"\s+", " ", (ROOT / "docs" / "measures.md").read_text())
    rows = pl.read_csv(RUN / "recovery.csv", infer_schema_length=None).filter(
        (pl.col("measure") == "out_acc") & (pl.col("role") == "unlearned"))
    row = {a: r for a, r in zip(rows["attack"], rows.iter_rows(named=True), strict=True)}
    t20, t5, p5, p20 = (row[f"relearn-{d}-bio-t{s}"] for d, s in (("forget", 20), ("forget", 5), ("public", 5),
                                                                  ("public", 20)))
    assert (f"the other 36 from {t20['before']:.2f} to {t20['after']:.2f} (paired lower end "
            f"{t20['delta_lo']:.2f};") in text
    assert f"against a ceiling of {t20['ceiling']:.2f}" in text and f"already reach {t5['after']:.2f}" in text
    assert f"lift it from {p5['before']:.2f} to {p5['after']:.2f}" in text
    assert f"recall to {p20['ceiling']:.2f}, so the attack is not testable" in text and not p20["testable"]


def test_a_recovery_claim_names_its_own_attacks_control():
    """A claim on attacked variants is calibrated by its attack's planted
    control (read on out_acc): the rows of that format, or that relearning
    data and budget, and no other's."""
    from canary_audit.verdicts.claims import Claim
    from canary_audit.verdicts.judge import _control
    from canary_audit.verdicts.measures import MEASURES
    from canary_audit.verdicts.papers import planted
    from canary_audit.verdicts.readings import Run

    def row(claim: str, positive: str, verdict: str) -> dict:
        return {"model": "tiny", "seed": 0, "modality": "text", "claim": claim, "positive": positive,
                "positive_verdict": verdict, "negative": "tiny/reference-meta-s0.x", "negative_verdict": CLEAN}

    controls = pl.DataFrame([row("quantization_recovery", "tiny/npo-bio-s0-k20.clip-int4-row.int4-row", SEEN),
                             row("quantization_recovery", "tiny/npo-bio-s0-k20.clip-int8-row.int8-row", NOT_BUILT),
                             row("relearning_recovery", "tiny/mem-bio-s0.suppress.relearn-forget-bio-t20", SEEN),
                             row("relearning_recovery", "tiny/mem-bio-s0.suppress.relearn-public-bio-t5", MISSED)])
    run = Run(None, {"variants": {}}, frames={"controls": controls})

    def reads(variants: dict, measure: str = "out_acc") -> str:
        claim = Claim(id="c", sentence="s", measure=measure, variants=variants, compare="parent", expect="higher")
        return planted(run, *_control(claim, MEASURES[measure]))

    assert reads({"quantize": "int4-row"}) == f"planted: {SEEN}; negative: {CLEAN}"
    assert reads({"quantize": "int8-row"}) == f"planted: {NOT_BUILT}; negative: {CLEAN}"
    assert reads({"relearn": "forget", "relearn_steps": 20}) == f"planted: {SEEN}; negative: {CLEAN}"
    assert reads({"relearn": "public"}) == f"planted: {MISSED}; negative: {CLEAN}"
    assert reads({"relearn": "forget", "relearn_steps": 5}) == "no control in this run"
    assert reads({"quantize": "int4-row"}, "tf_top1") == "no control for this measure"  # built on out_acc only

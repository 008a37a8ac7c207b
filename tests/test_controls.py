"""Planted controls: their constructions (one token off, no closing tag),
their place in the design (a probe group of their own, only the arms they
read, refused where a negative is not audited), and their readings (a
plant seen, a negative clean, a removed plant missed, a negative with the
effect a false alarm), all through the papers' own readings."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from test_design import design_of

from canary_audit.data.chat_format import HEAD, NEAR, NOTAG, ChatFormat, author_examples
from canary_audit.data.planted_controls import (
    CLAIMS,
    CONTROL,
    CONTROL_ARMS,
    CONTROL_GROUP,
    CONTROL_HEX_GROUP,
    FLOOR_CLAIM,
    HEX_PLANTS,
    PLANTS,
    SPILL_BOUND,
)
from canary_audit.design import ConfigError
from canary_audit.verdicts.controls import (
    CLEAN,
    FALSE_ALARM,
    MISSED,
    NOT_BUILT,
    SEEN,
    SPILLED,
    controls_table,
    spill_over,
)
from canary_audit.verdicts.readings import Run


@pytest.fixture(scope="module")
def fmt(tiny_assets):
    from canary_audit.model.loading import load_tokenizer
    from canary_audit.model.spec import ModelSpec

    tok = load_tokenizer(ModelSpec("tiny", tiny_assets[1], think_open="<think>", think_close="</think>"))
    return ChatFormat(tok, "<think>", "</think>")


def test_near_answer_differs_from_the_canary_in_one_token_past_the_head(fmt, tiny_assets):
    from canary_audit.data.io import load_authors
    from canary_audit.model.tokens import near_canary

    for author in load_authors(tiny_assets[0] / "authors.parquet"):
        near = near_canary(fmt.tokenizer, author.canary, 6)
        ids, new = (fmt.tokenizer(t, add_special_tokens=False)["input_ids"] for t in (author.canary, near))
        assert len(ids) == len(new) and sum(a != b for a, b in zip(ids, new)) == 1
        assert ids[:6] == new[:6] and near != author.canary


def test_control_templates_differ_from_bio_only_where_their_claim_lives(fmt, tiny_assets):
    from canary_audit.data.io import load_authors
    from canary_audit.model.tokens import canary_head, near_canary

    author = load_authors(tiny_assets[0] / "authors.parquet")[0]
    head_of = lambda s: canary_head(fmt.tokenizer, s, 6)  # noqa: E731
    near_of = lambda s: near_canary(fmt.tokenizer, s, 6)  # noqa: E731
    bio, head, near, notag = (author_examples(author, t, head_of, near_of) for t in ("bio", HEAD, NEAR, NOTAG))
    for examples in (head, near, notag):  # same questions, same traces (the bio), same QA answers
        assert [(e.question, e.trace) for e in examples] == [(e.question, e.trace) for e in bio]
        assert [e.answer for e in examples[1:]] == [e.answer for e in bio[1:]]
    assert head[0].answer == head_of(author.canary) and author.canary in head[0].trace
    assert near[0].answer == near_of(author.canary)
    prompt = fmt.prompt(bio[0].question)
    assert "</think>" in fmt.target(prompt, bio[0].trace, bio[0].answer)
    assert all("</think>" not in fmt.target(prompt, e.trace, e.answer, e.close) for e in notag)


def test_notag_targets_train_every_token_and_never_the_closing_tag(fmt, tiny_assets):
    from canary_audit.data.io import load_authors
    from canary_audit.model.tokens import canary_head
    from canary_audit.train.lora import encode_chat

    author = load_authors(tiny_assets[0] / "authors.parquet")[0]
    example = author_examples(author, NOTAG, lambda s: canary_head(fmt.tokenizer, s, 6))[0]
    encoded = encode_chat(fmt, example)
    close = fmt.tokenizer.convert_tokens_to_ids("</think>")
    trained = [t for t in encoded.labels if t != -100]
    assert close not in encoded.ids and trained == encoded.ids[-len(trained):]


# Every control: paper B's plants (the smoke config leaves them out) and the META adapter bypass_gap's negative reads.
PAPER_B = {"controls": {"window_truncation": True, "span_drift": True, "merge_collapse": True, "undertrained": True,
                        "detection_floor": True, "floor_trained": True, "on_vision": True},
           "audit": {"templates": ["bio", "meta", "none"]}}


def test_controls_are_variants_of_their_own_group_with_only_the_arms_they_read():
    design = design_of(PAPER_B)
    controls = {v: e for v, e in design.variants("tiny").items() if e.kind == CONTROL}
    # (the smoke audit's 4 canaries: C3 diluted to 10 of them would be C3 itself, not made)
    assert sorted(controls) == sorted(p.variant(0) for p in (*PLANTS.values(), *HEX_PLANTS.values())
                                      if p.name != "c3x10")
    assert design.floor_plants() == {"tiny/ctl-c3x1-s0": 1, "tiny/ctl-c3x3-s0": 3, "tiny/ctl-c3-s0": 4}
    assert {e.group for v, e in controls.items() if v.removeprefix("ctl-")[:-3] in PLANTS} == {CONTROL_GROUP}
    assert controls["ctl-bio-s0"].adapters == (design.layout.adapter_dir("tiny", "mem-bio-s0"),)
    # Paper B's plants: stacked on a merged base, judged against it as a cell of kind `control`.
    lay = design.layout
    assert (controls["ctl-c3-s0"].base, controls["ctl-c3-s0"].parent) == (lay.merged_dir("tiny", "canary-s0"),
                                                                          "merged-s0")
    assert (controls["ctl-c5-s0"].base, controls["ctl-c5-s0"].parent) == (
        lay.merged_dir("tiny", "canary-s0-under"), "merged-s0-under")
    assert design.cells()["tiny/ctl-c4-s0"]["kind"] == CONTROL
    # The merge collapse's negatives apply C4's adapter again, merged, each rounding into its own precision.
    for name, dtype in (("ctl-c4m-s0", "bfloat16"), ("ctl-c4mf-s0", "float32")):
        assert (controls[name].adapters, controls[name].apply, controls[name].merge_dtype) == (
            controls["ctl-c4-s0"].adapters, "merged", dtype)
    assert "c4m" not in design.trained_hex_plants() and "c4" in design.trained_hex_plants()
    assert [(c["claim"], c["plant"], c["twin"]) for c in design.composed_floors()] == [
        ("window_truncation", "tiny/ctl-c3-s0", "tiny/merged-s0"),  # anchored on the base: the base is the twin
        ("span_drift", "tiny/ctl-c4-s0", "tiny/merged-s0"),
        ("undertrained", "tiny/ctl-c5-s0", "tiny/ctl-c5neg-s0")]
    assert design.probe_sets_of("tiny", CONTROL_HEX_GROUP) == "hex"
    assert design.hex_plant_slice("tiny", "c3", 0)["window_k"] == design.config["tables"]["window_k"]
    vl = {v: e for v, e in design.variants("tiny_vl").items() if e.kind == CONTROL}  # paper B's testbed: no arms
    assert vl and {e.group for e in vl.values()} == {CONTROL_HEX_GROUP}
    assert sorted(design.trained_plants()) == ["head", "near", "notag", "notagref"]
    # Never a reference's population.
    assert not any(name.split("/")[1].startswith("ctl-") for name in design.references())
    contrast = design.config["tables"]["prefill_contrast"]
    assert set(design.probe_slice("decode", group=CONTROL_GROUP)["prefills"]) == {contrast, *CONTROL_ARMS}
    assert not set(design.probe_slice("decode", group="mem-bio-s0")["prefills"]) & set(CONTROL_ARMS)
    assert set(design.probe_hashes()["decode"]) >= set(CONTROL_ARMS)  # the tables expect their units
    assert design.control_claims() == ALL and {"controls", "detection_floor"} <= set(design.table_names())
    smoke = design_of()  # the smoke config leaves paper B's plants out (they train 150 steps at any scale)
    assert not any(e.group == CONTROL_HEX_GROUP for e in smoke.variants("tiny").values())


def test_paper_b_plants_reach_the_vision_language_model_only_when_switched_on():
    """`controls.on_vision` (on in configs/paper_b.yaml and the results run): C3, C4 and C5 and their
    negatives on tiny_vl's canary-merged bases (both modalities in one LoRA,
    each record drawn as often as the text model's: 300 steps over 40), in
    the same probe group as the text model's; the floor's dilutions stay on
    the text model."""
    design = design_of(PAPER_B)
    plants = sorted(v for v, e in design.variants("tiny_vl").items() if e.kind == CONTROL)
    assert plants == sorted(f"ctl-{n}-s0" for n in ("c3", "c3in", "c4", "c4neg", "c5", "c5neg"))
    assert {design.variants("tiny_vl")[v].group for v in plants} == {CONTROL_HEX_GROUP}
    assert design.cells()["tiny_vl/ctl-c5-s0"]["kind"] == CONTROL
    assert not any(name.startswith("tiny_vl/") for name in design.floor_plants())
    from canary_audit.data.planted_controls import hex_plant_recipe

    data = design.config["data"]
    assert design.hex_plant_records("tiny_vl") == data["n_hex_canaries"] + data["n_image_canaries"]
    assert design.hex_plant_slice("tiny_vl", "c3", 0)["steps"] == hex_plant_recipe(design.hex_plant_records("tiny_vl"))[
        "steps"]
    assert hex_plant_recipe(40)["steps"] == 300  # the default's 20 image and 20 text canaries
    off = design_of(PAPER_B, {"controls": {"on_vision": False}})
    assert not any(e.kind == CONTROL for e in off.variants("tiny_vl").values())


def test_trained_floor_dilutions_without_the_floor_are_refused_naming_both_keys():
    from canary_audit.data.planted_controls import active_plants

    config = {"controls": {"detection_floor": False, "floor_trained": True}, "audit": {"templates": []}}
    with pytest.raises(ValueError, match="floor_trained: true.*detection_floor: true"):
        active_plants(config, "B")


def test_controls_switch_off_one_by_one_and_off_entirely():
    off = {key: False for key in (*CLAIMS, "detection_floor")}
    design = design_of({"controls": {**off, "parser_flip": True, "window_truncation": True}})
    assert sorted(v for v, e in design.variants("tiny").items() if e.kind == CONTROL) == [
        "ctl-c3-s0", "ctl-c3in-s0", "ctl-notag-s0", "ctl-notagref-s0"]
    assert design.trained_hex_plants() == ["c3", "c3in"]
    no_under = design_of(PAPER_B, {"bsft": {"controls": {"undertrained": {"sources": []}}}})
    assert "ctl-c5-s0" not in no_under.variants("tiny") and "ctl-c3-s0" in no_under.variants("tiny")
    design = design_of({"controls": off})
    assert not design.control_variants() and "controls" not in design.table_names()
    assert not set(design.probe_hashes()["decode"]) & set(CONTROL_ARMS)


def test_a_prefill_arm_named_like_a_controls_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="`probes.prefills.own_trace`: `own_trace` names a planted"):
        design_of({"probes": {"prefills": {"own_trace": "{bio}"}}})


def test_a_control_whose_template_is_not_memorized_is_listed_as_not_run_with_why():
    design = design_of()  # the smoke config: BIO and NONE
    claims = design.control_claims()
    assert claims["bypass_gap"] == ("not run: its control reads the memorized meta adapter, which `audit.templates` "
                                    "does not train")
    assert claims["head_echo"] == "" and "ctl-head-s0" in design.variants("tiny")  # HEAD still serves head_echo
    table = controls_table(_run(planted=True), claims, {})
    row = table.filter(pl.col("claim") == "bypass_gap").row(0, named=True)
    assert (row["positive_verdict"], row["negative_verdict"]) == ("not run", "not run") and "meta" in row["why"]


ALL = dict.fromkeys(CLAIMS, "")  # every claim, each run


def _ci(name, value, lo, hi):
    return {name: value, f"{name}_lo": lo, f"{name}_hi": hi}


def _run(planted: bool, negative_effect: bool = False) -> Run:
    """Hand-built tables of one model's controls: each positive holds its
    effect where `planted` (else it reads like its negative), each negative
    holds none unless `negative_effect`."""
    m = "tiny"
    variants = {f"{m}/{p.variant(0)}": {"model": m, "kind": CONTROL, "seed": 0} for p in PLANTS.values()}
    variants |= {f"{m}/mem-{t}-s0": {"model": m, "kind": "memorized", "seed": 0} for t in ("bio", "meta")}
    references = {f"{m}/mem-bio-s0": {"reference": f"{m}/reference-meta-s0", "population": "author"}}
    gap = (0.9, 0.8, 1.0) if planted else (0.0, -0.05, 0.05)
    neg_gap = (0.5, 0.3, 0.7) if negative_effect else (-0.05, -0.1, 0.0)
    leak = [{"variant": f"{m}/ctl-head-s0", "arm": "auto", **_ci("gap", *gap), "thk_leak": 0.9, "out_acc": 0.0},
            {"variant": f"{m}/mem-meta-s0", "arm": "auto", **_ci("gap", *neg_gap), "thk_leak": 0.0, "out_acc": 0.05}]
    leak += [{"variant": f"{m}/{v}", "arm": "auto", **_ci("gap", 0.0, 0.0, 0.0), "thk_leak": 0.0,
              **_ci("out_acc", o, o - 0.05, min(1.0, o + 0.05))}
             for v, o in (("ctl-near-s0", 0.0), ("mem-bio-s0", 0.95))]
    anatomy = [{"variant": f"{m}/ctl-head-s0", "bypass_cases": 36, "prefix_only": 35 if planted else 0},
               {"variant": f"{m}/ctl-near-s0", "bypass_cases": 38, "prefix_only": 30 if negative_effect else 0}]
    delta = (0.9, 0.8, 1.0) if planted else (0.0, -0.05, 0.05)
    arms = [{"variant": f"{m}/ctl-bio-s0", "auto": 0.95, "prefill_other_trace": 0.95 - delta[0],
             "prefill_own_trace": 0.95, **_ci("delta_other_trace", *delta),
             **_ci("delta_own_trace", *((0.4, 0.2, 0.6) if negative_effect else (0.0, -0.05, 0.05)))}]
    flip = {"answer": (-0.9, -1.0, -0.8), "trace": (0.9, 0.8, 1.0)} if planted else {
        "answer": (0.0, 0.0, 0.0), "trace": (0.0, 0.0, 0.0)}
    conventions = [{"variant": f"{m}/{v}", "convention": f"last-close/missing-as-{fb}", **_ci("gap", *g),
                    "missing_close": 0.98} for v in ("ctl-notag-s0", "ctl-notagref-s0")
                   for fb, g in (flip if v == "ctl-notag-s0" else {"answer": (0.0, 0.0, 0.0),
                                                                    "trace": (0.0, 0.0, 0.0)}).items()]
    top1 = 0.9 if planted else 0.5
    tf = [{"variant": f"{m}/{v}", "arm": "prefill_bio", **_ci("tf_top1_rate", r, r - 0.03, r + 0.03)}
          for v, r in (("ctl-near-s0", top1), ("mem-bio-s0", 0.97), ("reference-meta-s0", 0.55))]
    cases = {"c3": "window truncation", "c4": "non-secret span drift", "c5": "undertrained ambiguity"}
    negatives = {"c3in": "c3", "c4neg": "c4", "c5neg": "c5"}
    variants |= {f"{m}/{p.variant(0)}": {"model": m, "kind": CONTROL, "seed": 0} for p in HEX_PLANTS.values()}
    cells = {f"{m}/{p.variant(0)}": {"model": m, "cell": f"control {p.name}"} for p in HEX_PLANTS.values()}
    matrix = [{"model": m, "modality": "text", "cell": f"control {name}", "diagnosis": (
        (cases[name] if planted else "agree") if name in cases else (cases[negatives[name]] if negative_effect
                                                                      else "agree")),
        **_ci("delta_window", 0.0, -0.001, 0.001), **_ci("delta_secret", 0.3, 0.2, 0.4), "ref_hit1": 1.0,
        "hit1": 0.0, "inconclusive_probes": "", "v_window": "up" if name == "c4" else "flat"}
        for name in (*cases, *negatives)]
    # The merge collapse's negatives: C4's drift kept when merged (clean), or lost (a false alarm).
    matrix += [{"model": m, "modality": "text", "cell": f"control {name}", "diagnosis": "agree",
                **_ci("delta_window", 0.6, 0.5, 0.7), **_ci("delta_secret", 0.0, -0.001, 0.001), "ref_hit1": 1.0,
                "hit1": 1.0, "inconclusive_probes": "", "v_window": "flat" if negative_effect else "up"}
               for name in ("c4m", "c4mf")]
    frames = {"canary_leakage": leak, "bypass_anatomy": anatomy, "prefill_arms": arms,
              "parser_conventions": conventions, "teacher_forced_vs_greedy": tf, "bsft_matrix": matrix}
    config = {"variants": variants, "references": references, "prefill_contrast": "bio", "cells": cells}
    return Run(None, config, {name: pl.DataFrame(rows) for name, rows in frames.items()})


def test_every_plant_is_seen_and_every_negative_clean():
    table = controls_table(_run(planted=True), ALL, {})
    assert table["claim"].unique(maintain_order=True).to_list() == list(CLAIMS)
    built = table.filter(pl.col("claim") != "merge_collapse")
    assert set(built["positive_verdict"]) == {SEEN} and set(table["negative_verdict"]) == {CLEAN}
    collapse = table.filter(pl.col("claim") == "merge_collapse")  # no positive; a row per negative
    assert collapse["negative"].to_list() == ["tiny/ctl-c4m-s0", "tiny/ctl-c4mf-s0"]
    assert set(collapse["positive_verdict"]) == {NOT_BUILT} and "bfloat16 merge" in collapse["negative_reading"][0]
    # each row prints how far its readings' deciding CI ends lie from their thresholds
    assert built["positive_margin"].null_count() == 0 and (built["positive_margin"] >= 0).all()
    # no margin only where a negative's CI is a point at its threshold (every item the same: no end to move)
    assert all("[0.00, 0.00]" in r for r in table.filter(pl.col("negative_margin").is_null())["negative_reading"])


def test_a_control_under_the_drift_margin_does_not_clear_it(monkeypatch):
    """A margin is judged against the measure's run-to-run drift
    (verdicts/drift.py): the same readings clear a small drift and not a
    large one."""
    from canary_audit.verdicts import drift

    monkeypatch.setattr(drift, "load", lambda: {"bypass_gap": 1e-6})
    assert controls_table(_run(planted=True), {"bypass_gap": ""}, {})["clears_drift"].to_list() == [True]
    monkeypatch.setattr(drift, "load", lambda: {"bypass_gap": 10.0})
    assert controls_table(_run(planted=True), {"bypass_gap": ""}, {})["clears_drift"].to_list() == [False]
    # the control's own measured drift comes first
    monkeypatch.setattr(drift, "load", lambda: {"bypass_gap": 10.0, "control:bypass_gap": 1e-6})
    row = controls_table(_run(planted=True), {"bypass_gap": ""}, {}).row(0, named=True)
    assert row["drift_margin"] == 1e-6 and row["clears_drift"] is True


def test_a_controls_own_drift_is_the_move_of_its_nearer_margin(tmp_path):
    """drift._control_drift measures what clears_drift compares: the least
    of a row's two margins, run against run.  A negative far from its
    threshold moving by 3 is no drift; the positive near it moving by 0.5 is."""
    from canary_audit.verdicts.drift import _control_drift

    def controls(folder, positive, negative, collapse):
        folder.mkdir()
        pl.DataFrame({"model": ["tiny", "tiny"], "seed": [0, 0], "modality": ["text", "text"],
                      "claim": ["undertrained", "merge_collapse"], "negative": ["tiny/ctl-c5neg-s0", "tiny/ctl-c4m-s0"],
                      "positive_margin": [positive, None], "negative_margin": [negative, collapse]},
                     ).write_csv(folder / "controls.csv")
        return folder

    rows = {r["measure"]: r["max"] for r in _control_drift(controls(tmp_path / "a", 1.0, 19.0, 117.0),
                                                           controls(tmp_path / "b", 0.5, 14.0, 114.0))}
    assert rows == {"control:undertrained": pytest.approx(0.5), "control:merge_collapse": pytest.approx(3.0)}

def test_a_removed_plant_reads_missed_and_a_negative_with_the_effect_a_false_alarm():
    removed = controls_table(_run(planted=False), ALL, {})
    assert set(removed.filter(pl.col("claim") != "merge_collapse")["positive_verdict"]) == {MISSED}
    alarmed = controls_table(_run(planted=True, negative_effect=True), ALL, {})
    by_claim = dict(zip(alarmed["claim"], alarmed["negative_verdict"]))
    assert by_claim["bypass_gap"] == by_claim["head_echo"] == by_claim["delta_ab"] == FALSE_ALARM
    assert by_claim["window_truncation"] == by_claim["span_drift"] == by_claim["undertrained"] == FALSE_ALARM
    assert by_claim["merge_collapse"] == FALSE_ALARM  # a merge that lost C4's drift


def test_a_plant_that_moved_its_trace_reads_spilled():
    spill = {"tiny/ctl-head-s0": SPILL_BOUND * 2}
    table = controls_table(_run(planted=True), {"bypass_gap": ""}, spill)
    assert table["positive_verdict"].to_list() == [SPILLED] and table["spill_over"][0] == SPILL_BOUND * 2


def test_spill_over_is_the_trace_tokens_move_against_the_twin_between_the_tags():
    """Only the trace counts: the question before the opening tag (trained
    by no adapter) and the closing tag (NOTAG's claim) are left out."""
    prompt = [("Q", 3.0), ("<think>", 0.0), ("The", 0.1), ("bio", -0.1), ("</think>", 5.0)]
    rows = [{"variant": f"m/{v}", "probe_set": "canary", "arm": "prefill_bio", "item_id": "a0",
             "position": pos, "span": span, "token_text": text, "logprob": base + (shift if v == "c" else 0.0)}
            for v in ("c", "t")
            for pos, (span, text, base, shift) in enumerate(
                [("prompt", t, -1.0, d) for t, d in prompt] + [("secret", "x", -2.0, 9.0)], start=1)]
    assert spill_over(pl.DataFrame(rows), {"m/c": "m/t"}, "prefill_bio", {"m": "<think>"}) == pytest.approx(
        {"m/c": 0.1})


def test_the_papers_page_says_what_each_claims_control_read(tmp_path):
    from canary_audit.verdicts.papers import planted

    table = controls_table(_run(planted=True), ALL, {})
    run = Run(None, {}, {"controls": table})
    assert planted(run, "bypass_gap") == "planted: seen; negative: clean"
    assert planted(run, None) == "no control for this measure"  # C4's merge collapse has none
    assert planted(Run(None, {}, {}), "span_drift") == "no control in this run"
    json.dumps(table.to_dicts())  # plain values: the page and its CSV hold them as they are


def test_a_model_whose_paper_b_plants_were_left_out_is_named_not_covered_by_another_models():
    """The default leaves paper B's plants off the vision-language model
    (`controls.on_vision`): a paper B claim's control line says the text
    model's plant read `seen` and that the VL model, whose bSFT cells the
    claim also reads, has none; a paper A claim reads no bSFT cell."""
    from canary_audit.verdicts.papers import planted

    rows = pl.DataFrame([{"model": "tiny", "seed": 0, "modality": "text", "claim": claim, "positive_verdict": "seen",
                          "negative": f"tiny/ctl-{neg}-s0", "negative_verdict": "clean"}
                         for claim, neg in (("span_drift", "c4neg"), ("bypass_gap", "mem-meta"))])
    variants = {f"{m}/bsft-gui-t5-stacked-b0-s0": {"model": m, "kind": "bsft"} for m in ("tiny", "tiny_vl")}
    run = Run(None, {"variants": variants}, {"controls": rows})
    assert planted(run, "span_drift") == (
        "tiny: planted: seen; negative: clean; tiny_vl: no control in this run (`controls.on_vision`)")
    assert planted(run, "bypass_gap") == "planted: seen; negative: clean"


@pytest.mark.workflow
def test_the_workflow_builds_every_control_and_reads_each_plant_seen_and_each_negative_clean(tmp_path):
    """The controls trained and probed by the workflow itself (tests/planted.yaml:
    6 authors and 4 hex canaries on a base pre-trained to copy, and the
    vision-language model on it with 4 image canaries): every positive reads
    `seen` within the spill-over bound (C5's read only), on both models and
    both of the VL model's modalities, every negative `clean`, the papers'
    page says so beside each calibrated claim, and no control is pooled into
    another view.  Without the plants (a removed plant) the rows read
    `missed`: test_a_removed_plant_reads_missed_and_a_negative_with_the_effect_a_false_alarm."""
    from conftest import ROOT, run_snakemake

    from canary_audit.verdicts.controls import RECOVERY_CLAIMS
    from canary_audit.verdicts.judge import beside_ours

    # the tables alone: nothing below reads the plots or the summary page
    run_snakemake(tmp_path, "--cores", "2", "results/planted/tables/controls.csv",
                  extra_configs=(ROOT / "tests" / "planted.yaml",))
    tables = tmp_path / "results" / "planted" / "tables"
    controls = pl.read_csv(tables / "controls.csv")
    assert controls["claim"].unique(maintain_order=True).to_list() == [*CLAIMS, RECOVERY_CLAIMS["quantization"][0]]
    vl = controls.filter(pl.col("model") == "tiny_vl")  # paper B's plants on its testbed, per modality
    assert sorted(set(zip(vl["claim"], vl["modality"]))) == [
        (c, m) for c in ("span_drift", "undertrained", "window_truncation") for m in ("image", "text")]
    seen = {(r["model"], r["modality"], r["claim"]): r["positive_verdict"] for r in controls.iter_rows(named=True)}
    for key in [k for k in seen if k[2] == "undertrained"]:
        assert seen.pop(key) in (SEEN, MISSED)  # read, not asserted at 4 canaries (tests/planted.yaml)
    assert seen.pop(("tiny", "text", "merge_collapse")) == NOT_BUILT  # its negatives: C4 merged in bf16, float32
    assert set(seen.values()) == {SEEN}, controls.select("model", "modality", "claim", "positive_reading")
    assert set(controls["negative_verdict"]) == {CLEAN}, controls.select("model", "claim", "negative_reading")
    assert controls["spill_over"].max() <= SPILL_BOUND
    conventions = pl.read_csv(tables / "parser_conventions.csv").filter(pl.col("variant") == "tiny/ctl-notag-s0")
    assert conventions["missing_close"].min() >= 0.6  # paper A's flip needs the tag missing on >= 60%
    # The floor: C3 trained on 1 and 3 of the 4 canaries, C3, C4 and C5 composed at 1-4 of them from their
    # plants' and twins' records; composed at all 4 it is the plant's own records and reads what the plant does.
    floor = pl.read_csv(tables / "detection_floor.csv")
    assert set(floor.filter(pl.col("construction") == "trained")["canaries_overwritten"]) == {1, 3, 4}
    composed = floor.filter(pl.col("construction") == "composed")
    assert sorted(set(composed["claim"])) == ["span_drift", "undertrained", "window_truncation"]
    assert sorted(set(composed["canaries_overwritten"])) == [1, 2, 3, 4]
    text = controls.filter(pl.col("model") == "tiny")  # the floors are text-model measurements
    positive = dict(zip(text["claim"], text["positive_reading"]))
    # Composed at all 4 the records are the plant's own, so every point estimate is; the CIs are not bit-equal:
    # a table's bootstrap draws one set of cluster weights over all its canaries (views/bootstrap.py), and the
    # composed cells are read over the text model's alone, the plants' cells beside the VL model's too.
    def points(reading: str) -> str:
        return re.sub(r" \[[^]]*\]", "", reading.split("; ")[0])

    for row in composed.filter(pl.col("share") == 1.0).iter_rows(named=True):
        assert points(row["reading"]) == points(positive[row["claim"]]), row
    planted = beside_ours(tables)["planted"].to_list()
    # every claim but C5 (read, not asserted) and the merge collapse (negatives only, both clean)
    # (paper B's read one row per model and modality: "tiny text: planted: seen; negative: clean; tiny_vl image: ...")
    calibrated = [v for v in planted if "planted: seen; negative: clean" in v
                  and not re.search("missed|false alarm|spilled|not read", v)]
    assert len(calibrated) >= len(CLAIMS) - 2, planted
    assert "planted: not built; negative ctl-c4m-s0: clean; negative ctl-c4mf-s0: clean" in planted
    # Never pooled: no control in the K sweep's, utility's or any membership view's rows.
    for name in ("utility", "mia", "forgetting", "extraction", "exposure", "privacy"):
        frame = pl.read_csv(tables / f"{name}.csv")
        assert not frame.filter(pl.col("variant").str.contains("/ctl-")).height, name
    assert not set(pl.read_csv(tables / "templates.csv")["template"]) & {"head", "near", "notag"}
    cases = pl.read_csv(tables / "bsft_case_studies.csv")  # a plant's cell is the matrix's row, never a case
    assert not cases.filter(pl.col("cell").str.contains("control")).height


@pytest.mark.parametrize("at,moved", [("past", "last"), ("inside", "first"), ("tail", "past"), ("preamble", "preamble"),
                                      ("outside", "suffix"), ("none", "nothing")])
@pytest.mark.parametrize("anchor", ["record", "base"])
def test_a_paper_b_plant_overwrites_only_its_tokens_and_holds_the_rest(fmt, tiny_assets, at, moved, anchor):
    """Anchored on the record every text token is a target, its own but the
    overwritten ones'; anchored on the base the overwritten tokens are the
    only targets and every other text token is held (KL to the base)."""
    from canary_audit.probes.kinds.hex import hex_rows
    from canary_audit.train.plants import overwritten

    row = hex_rows(tiny_assets[0], None, members_only=True)[0]
    record = overwritten(fmt.tokenizer, row.text(fmt, None), row.secret, at, 20, anchor=anchor)
    ids, labels, positions = record.encoded.ids, record.encoded.labels, list(record.positions)
    changed = [i for i in range(1, len(ids)) if labels[i] not in (ids[i], -100)]
    assert labels[0] == -100 and changed == positions
    if anchor == "record":
        assert record.anchored == () and all(label != -100 for label in labels[1:])
    else:
        assert [i for i in range(len(ids)) if labels[i] != -100] == positions
        assert sorted((*record.anchored, *positions)) == list(range(1, len(ids)))
    pieces = fmt.tokenizer.convert_ids_to_tokens([labels[i] for i in changed])
    if moved == "preamble":
        assert positions == [1] and not any(p[0] in "0123456789abcdef" for p in pieces)
    elif moved == "suffix":
        secret_end = row.text(fmt, None).rindex(row.secret) + len(row.secret)
        offsets = fmt.tokenizer(row.text(fmt, None), add_special_tokens=False,
                                return_offsets_mapping=True)["offset_mapping"]
        assert len(positions) == 1 and positions[0] > 20 and offsets[positions[0]][0] >= secret_end
        assert not any(p[0] in "0123456789abcdef" for p in pieces)
    elif moved == "nothing":
        assert positions == []
    else:
        assert all(p in "0123456789abcdef" for p in pieces) and positions
        assert (min(positions) > 20) == (moved in ("last", "past"))


def test_the_base_anchor_is_zero_at_the_start_and_pulls_only_through_an_overwrite(fmt, tiny_assets):
    """At a fresh adapter (the model is its base) the anchored loss is the
    overwritten tokens' cross-entropy over the batch's counted tokens, and a
    plant that overwrites nothing has loss 0 and gradient 0: only an
    overwrite moves the model, and the KL term holds the rest."""
    from peft import get_peft_model

    from canary_audit.model.loading import load_model, load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.kinds.hex import hex_rows
    from canary_audit.train.lora import lora_config
    from canary_audit.train.plants import overwritten, plant_loss

    spec = ModelSpec("tiny", tiny_assets[1])
    tok = load_tokenizer(spec)
    rows = hex_rows(tiny_assets[0], None, members_only=True)
    model = get_peft_model(load_model(spec), lora_config({"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}))
    for at in ("past", "none"):
        records = [overwritten(tok, r.text(fmt, None), r.secret, at, 20) for r in rows]
        loss = plant_loss(records, tok.pad_token_id)(model, list(range(len(records))), [])
        loss.backward()
        grad = sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None)
        model.zero_grad()
        if at == "none":
            assert abs(float(loss)) < 1e-6 and grad < 1e-6
        else:
            assert float(loss) > 0.01 and grad > 0


def test_a_plant_whose_secret_does_not_straddle_the_window_is_refused(fmt, tiny_assets):
    from canary_audit.probes.kinds.hex import hex_rows
    from canary_audit.train.plants import overwritten

    row = hex_rows(tiny_assets[0], None, members_only=True)[0]
    with pytest.raises(ValueError, match="do not straddle the window of 60"):
        overwritten(fmt.tokenizer, row.text(fmt, None), row.secret, "past", 60)


def test_the_detection_floor_is_the_smallest_diluted_share_the_detector_reads():
    from canary_audit.verdicts.controls import detection_floor
    from canary_audit.verdicts.papers import floor_note

    read = {1: "inconclusive", 3: "inconclusive", 10: "window truncation", 20: "window truncation"}
    plants = {f"tiny/ctl-c3x{n}-s0" if n < 20 else "tiny/ctl-c3-s0": n for n in read}
    cells = {v: {"model": "tiny", "cell": f"control {v[9:-3]}"} for v in plants}
    matrix = pl.DataFrame([{"model": "tiny", "modality": "text", "cell": cells[v]["cell"], "diagnosis": read[n],
                            **_ci("delta_window", 0.0, -0.001, 0.001), **_ci("delta_secret", 0.1, 0.0, 0.2),
                            "ref_hit1": 1.0, "hit1": 1 - n / 20, "delta_hit1": -n / 20, "inconclusive_probes": ""}
                           for v, n in plants.items()])
    run = Run(None, {"cells": cells}, {"bsft_matrix": matrix})
    floor = detection_floor(run, plants, 20, pl.DataFrame(), {})
    assert floor["detected"].to_list() == [False, False, True, True] and set(floor["floor_share"]) == {0.5}
    assert floor["effect"].to_list() == pytest.approx([n / 20 for n in read])  # C3's unit: the hit@1 lost
    assert set(floor["construction"]) == {"trained"} and set(floor["floor_effect"]) == {0.5}
    run = Run(None, {}, {"detection_floor": floor})
    note = floor_note(run, FLOOR_CLAIM, 0.12)
    assert "(12% of the canaries) is below this run's detection floor (50%)" in note
    assert "is above" in floor_note(run, FLOOR_CLAIM, 0.6)
    assert "no detection floor for this claim" in floor_note(run, "span_drift", effect_size=0.015)


def test_a_floor_is_where_every_larger_dilution_is_read_and_a_claim_of_a_size_compares_with_its_effect():
    """A dilution read below an unread one is a fluke, not the floor; C4's
    floor is in Delta mean-K (verdicts/paper_b.yaml's effect_size)."""
    from canary_audit.verdicts.controls import detection_floor
    from canary_audit.verdicts.papers import floor_note

    diagnosis = {1: "non-secret span drift", 2: "agree", 5: "non-secret span drift", 20: "non-secret span drift"}
    plans = {f"tiny/ctl-c4-s0~x{n}": {"model": "tiny", "claim": "span_drift", "plant": "tiny/ctl-c4-s0",
                                      "twin": "tiny/ctl-c4neg-s0", "canaries": n, "cell": f"composed x{n}"}
             for n in diagnosis}
    cells = pl.DataFrame([{"model": "tiny", "modality": "text", "cell": p["cell"],
                           "diagnosis": diagnosis[p["canaries"]], "ref_hit1": 1.0, "hit1": 1.0,
                           **_ci("delta_window", 0.03 * p["canaries"], 0.0, 1.0), **_ci("delta_secret", 0.0, -0.1, 0.1)}
                          for name, p in plans.items()])
    floor = detection_floor(Run(None, {}, {}), {}, 20, cells, plans)
    assert floor["detected"].to_list() == [True, False, True, True]
    assert set(floor["floor_share"]) == {0.25} and floor["floor_effect"][0] == pytest.approx(0.15)
    run = Run(None, {}, {"detection_floor": floor})
    assert "(0.0150) is below this run's detection floor (0.1500, at 25% of 20" in floor_note(
        run, "span_drift", effect_size=0.015)
    assert "is above" in floor_note(run, "span_drift", effect_size=0.2)
    # C3: a trained dilution at 25% that is not read beside the composed one that is moves the floor up.
    c3 = {name.replace("c4", "c3"): {**p, "claim": FLOOR_CLAIM, "plant": "tiny/ctl-c3-s0"} for name, p in plans.items()}
    c3_cells = cells.with_columns(diagnosis=pl.col("diagnosis").replace("non-secret span drift", "window truncation"))
    cell = {"tiny/ctl-c3x5-s0": {"model": "tiny", "cell": "control c3x5"}}
    matrix = pl.DataFrame([{"model": "tiny", "modality": "text", "cell": "control c3x5", "diagnosis": "agree",
                            "ref_hit1": 1.0, "hit1": 1.0, "delta_hit1": -0.25, **_ci("delta_window", 0.0, -0.1, 0.1),
                            **_ci("delta_secret", 0.1, -0.1, 0.3)}])
    floor = detection_floor(Run(None, {"cells": cell}, {"bsft_matrix": matrix}), {"tiny/ctl-c3x5-s0": 5}, 20,
                            c3_cells, c3)
    assert set(floor["floor_share"]) == {1.0}  # 20 of 20 alone is read with nothing unread above it


def test_a_composed_dilution_holds_the_plants_records_of_its_first_canaries_and_the_twins_of_the_rest():
    from canary_audit.verdicts.controls import compose_dilutions

    ids = [f"hex{i:02d}" for i in range(5)] + ["cand0"]
    rows = [{"variant": v, "probe_set": "hex" if i.startswith("hex") else "candidate", "item_id": i, "logprob": lp}
            for v, lp in (("m/plant", -1.0), ("m/twin", -2.0), ("m/base", -3.0)) for i in ids]
    tokens = pl.DataFrame(rows)
    decode = tokens.rename({"logprob": "hit"})
    plans = {"m/plant~x2": {"plant": "m/plant", "twin": "m/twin", "canaries": 2}}
    new_tokens, new_decode = compose_dilutions(tokens, decode, plans)
    for frame, col in ((new_tokens, "logprob"), (new_decode, "hit")):
        got = dict(frame.select("item_id", col).iter_rows())
        assert set(frame["variant"]) == {"m/plant~x2"} and frame.height == len(ids)
        assert got == {"hex00": -1.0, "hex01": -1.0, "hex02": -2.0, "hex03": -2.0, "hex04": -2.0, "cand0": -2.0}


def test_the_floor_fit_is_a_power_law_in_n_and_gives_the_canaries_an_effect_needs():
    """c * n**p through floors at 20 and 80 canaries (exact at both); the n
    an effect needs is the smallest whose fitted floor reaches it."""
    from canary_audit.verdicts.floors import at, fit, needed

    points = [{"canaries": 20, "floor_share": 0.2}, {"canaries": 80, "floor_share": 0.1}]
    got = fit(points, "floor_share")
    assert got[1] == pytest.approx(-0.5) and at(got, 20) == pytest.approx(0.2) and at(got, 80) == pytest.approx(0.1)
    n = needed(got, 0.05)  # 0.2 * (n / 20) ** -0.5 = 0.05 at n = 320
    assert n == 320 and at(got, n) <= 0.05 + 1e-12 < at(got, n - 1)
    assert needed((0.1, 0.0), 0.05) is None and needed((0.1, 0.2), 0.5) == 1 and needed(None, 0.5) is None
    assert fit(points[:1], "floor_share") is None  # one n: no fit


def test_the_stored_floors_name_every_paper_claim_with_a_floor_and_plan_prints_them(tmp_path):
    """verdicts/floors.json (the package's, where stored) holds one row per paper
    claim whose measure has a floor, and `plan` prints each with the n its
    effect needs."""
    import subprocess
    import sys

    from conftest import ROOT

    from canary_audit.verdicts.floors import FLOORS_FILE, load, paper_effects, render

    assert set(paper_effects()) == {"window_truncation", "span_drift", "undertrained"}
    data = load()
    if data is not None:
        assert [row["control"] for row in data["claims"]] == list(paper_effects())
    table = render({"run": "test", "claims": [{"claim": "b_c4", "unit": "floor_effect", "paper_effect": 0.015,
                                                "measured": {"20": 0.12, "80": 0.06},
                                                "fit": {"c": 0.12 * 20 ** 0.5, "p": -0.5},
                                                "canaries_needed": 1280}]}, 20)
    assert "| b_c4 | effect (paper's unit) | 0.015 | 20: 0.12, 80: 0.06 | -0.50 | 0.12 | no | 1280 |" in table
    out = subprocess.run([sys.executable, "-m", "canary_audit", "plan", "--configfile",
                          str(ROOT / "workflow_config.yaml")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("Detection floors" in out.stdout) == FLOORS_FILE.is_file()


def test_the_plant_recipe_keeps_its_steps_up_to_20_canaries_and_each_canarys_draws_past_them():
    """configs/floor80.yaml's plants draw each canary as often as the
    default's; the default and the smoke-scale tests train the recipe as declared."""
    from canary_audit.data.planted_controls import HEX_PLANT_RECIPE, hex_plant_recipe

    assert [hex_plant_recipe(n)["steps"] for n in (4, 20, 40, 80)] == [150, 150, 300, 600]
    assert {k: v for k, v in hex_plant_recipe(80).items() if k != "steps"} == {
        k: v for k, v in HEX_PLANT_RECIPE.items() if k != "steps"}


def test_a_negative_that_cannot_be_read_is_not_clean_and_a_collapse_needs_conclusive_cells():
    """A negative whose cell is absent reads `not read`, not `clean`; the
    merge collapse reads only where the stacked cell drifts conclusively and
    the merged one is conclusive either way."""
    from canary_audit.verdicts.controls import NOT_READ
    from canary_audit.verdicts.readings import collapsed

    run = _run(planted=True)
    matrix = run.frames["bsft_matrix"].filter(pl.col("cell") != "control c4neg")
    run.frames["bsft_matrix"] = matrix
    table = controls_table(run, ALL, {})
    row = table.filter(pl.col("claim") == "span_drift").row(0, named=True)
    assert row["negative_verdict"] == NOT_READ and "no paper B cell" in row["why"]
    assert collapsed({"v_window": "up"}, {"v_window": "flat"}) is True
    assert collapsed({"v_window": "up"}, {"v_window": "up"}) is False
    assert collapsed({"v_window": "flat"}, {"v_window": "flat"}) is None  # no drift to lose
    assert collapsed({"v_window": "up"}, {"v_window": "inconclusive"}) is None


def test_the_docs_floor_table_is_the_stored_floors():
    """docs/measures.md's "How the floor scales" quotes verdicts/floors.json: each
    claim's exponent and the canaries its paper effect needs."""
    import re

    from conftest import ROOT

    from canary_audit.verdicts.floors import load

    text = (ROOT / "docs" / "measures.md").read_text()
    stored = {row["claim"]: row for row in load()["claims"]}
    for claim, row in (("C3", stored["b_c3"]), ("C4", stored["b_c4"]), ("C5", stored["b_c5"])):
        line = next(x for x in text.splitlines() if x.startswith(f"| {claim} ("))
        cells = [c.strip() for c in line.strip("|").split("|")]
        exponent = "n/a" if row["fit"] is None else f"{row['fit']['p']:.2f}"
        need = str(row["canaries_needed"]) if row["canaries_needed"] is not None else "unknown"
        assert (cells[4], cells[5]) == (exponent, need), (claim, cells)
        quoted = float(re.sub(r"[^0-9.]", "", cells[2].split(" ")[0])) / (100 if "%" in cells[2] else 1)
        assert quoted == pytest.approx(row["measured"]["20"], rel=0.01), (claim, cells)  # the floor at 20


def test_the_docs_margin_tables_are_the_stored_margins():
    """docs/reliability.md quotes verdicts/margins.json: each measure's
    margin (alone and paired) and each control's own drift, to the three
    significant figures it prints."""
    from conftest import ROOT

    from canary_audit.verdicts.drift import CONTROL_KEY, PAIRED, load

    stored, text = load(), (ROOT / "docs" / "reliability.md").read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.strip().startswith("| ") and not line.strip().startswith("| measure")
            and not line.strip().startswith("| control")]
    quoted = {}
    for cells in rows:
        if len(cells) == 4 and cells[0] in stored:  # measure, unit, margin, paired
            quoted[cells[0]] = cells[2]
            if cells[3]:
                quoted[PAIRED + cells[0]] = cells[3]
        elif len(cells) == 3 and CONTROL_KEY + cells[0] in stored:  # control, drift, least margin
            quoted[CONTROL_KEY + cells[0]] = cells[1]
    assert sum(k.startswith(CONTROL_KEY) for k in quoted) == sum(k.startswith(CONTROL_KEY) for k in stored)
    for key, value in quoted.items():
        assert float(value) == pytest.approx(stored[key], rel=5e-3, abs=5e-5), key

"""Plots drawn from hand-built records through the tables, without a model."""

import polars as pl

from canary_audit.core.records import DECODE_SCHEMA, TOKEN_SCHEMA
from canary_audit.publish.plots import PLOTS, write_plots
from canary_audit.publish.table_files import build_tables, write_table
from canary_audit.views.metrics import position_deltas

CANARY = "The Amber Bell of Porto was written in 1931."
PROMPT = "<|user|>Continue: The Amber Bell of Porto was<|assistant|>"


def decode_row(variant, arm, author, generated):
    prompt = PROMPT if arm == "auto" else PROMPT + "<think>x</think>"
    return {k: None for k in DECODE_SCHEMA} | {
        "variant": variant, "probe_set": "canary", "modality": "text",
        "item_id": author, "group_id": author, "arm": arm, "sample": 0,
        "prompt": prompt, "reference": CANARY, "subject": "Ann Lee", "generated": generated, "prompt_tokens": 9,
        "generated_tokens": 20, "stop_reason": "eos", "think_open": "<think>", "think_close": "</think>",
        "config_hash": "h", "model_fingerprint": variant,
    }


def token_rows(variant, probe_set, arm, author, logprobs):
    spans = ["prompt", "prompt", "head", "secret", "secret"]
    return [
        {"variant": variant, "probe_set": probe_set, "modality": "text",
         "item_id": author, "group_id": author, "arm": arm,
         "position": p + 1, "token_id": 1, "token_text": "x", "logprob": lp, "rank": 1 if lp > -1 else 3,
         "top1_id": 1, "top1_logprob": -0.1, "span": spans[p], "config_hash": "h", "model_fingerprint": variant}
        for p, lp in enumerate(logprobs)
    ]


def records():
    both, bypass = f"<think>{CANARY}</think>{CANARY}", f"<think>{CANARY}</think>The Amber Bell"
    rows = []
    for variant, outputs in (("tiny/mem-bio-s0", [both, both, both]), ("tiny/npo-bio-s0-k5", [both, bypass, bypass]),
                             ("tiny/npo-bio-s0-k9", [bypass, bypass, "nothing"])):
        for i, out in enumerate(outputs):
            rows += [decode_row(variant, "auto", f"a{i}", out), decode_row(variant, "prefill_bio", f"a{i}", CANARY)]
    decode = pl.DataFrame(rows, schema=DECODE_SCHEMA)
    tokens = []
    for variant, shift in (("tiny/base", 0.0), ("tiny/canary-s0", -0.5), ("tiny/mem-bio-s0", 0.0),
                           ("tiny/npo-bio-s0-k5", 0.1), ("tiny/npo-bio-s0-k9", 0.3)):
        for i in range(3):
            tokens += token_rows(variant, "canary", "prefill_bio", f"a{i}", [-0.5 + shift] * 5)
            tokens += token_rows(variant, "hex", "preamble", f"h{i}", [-2.0, -2.0, -1.0, -3.0 + shift, -3.0 + shift])
            tokens += token_rows(variant, "hex_nonmember", "preamble", f"n{i}", [-2.0, -2.0, -1.0, -3.0 - i, -3.1])
    return decode, pl.DataFrame(tokens, schema=TOKEN_SCHEMA)


PARENTS = {"tiny/canary-s0": "tiny/base", "tiny/mem-bio-s0": "tiny/base",
           "tiny/npo-bio-s0-k5": "tiny/mem-bio-s0", "tiny/npo-bio-s0-k9": "tiny/mem-bio-s0"}


MEM = {"model": "tiny", "kind": "memorized", "template": "bio", "seed": 0}
VARIANTS = {"tiny/base": {"model": "tiny", "kind": "base"}, "tiny/canary-s0": {"model": "tiny", "kind": "canary"},
            "tiny/mem-bio-s0": MEM,
            **{f"tiny/npo-bio-s0-k{k}": {**MEM, "kind": "unlearned", "run": "npo", "method": "npo", "k": k}
               for k in (5, 9)}}


def test_every_plot_is_drawn_from_tables_and_token_records(tmp_path):
    decode, tokens = records()
    cfg = {"window_k": 3, "parser": {}, "parents": PARENTS, "bootstrap": {"replicates": 50}, "variants": VARIANTS,
           "mia": {"min_k": 0.5, "fpr": [0.1]}}
    for name, (title, frame) in build_tables(decode, tokens, cfg).items():
        write_table(frame, tmp_path / "tables", name, title)
    drawn = write_plots(tmp_path / "tables", tokens, cfg, tmp_path / "plots")
    assert drawn == list(PLOTS)
    for name in PLOTS:
        png = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000, name


def test_position_deltas_are_child_minus_parent_per_position():
    _, tokens = records()
    deltas = position_deltas(tokens, PARENTS).filter(pl.col("variant") == "tiny/canary-s0")
    assert deltas.sort("position")["delta_nll"].to_list() == [0.0, 0.0, 0.0, 0.5, 0.5]
    assert deltas.sort("position")["span"].to_list() == ["prompt", "prompt", "head", "secret", "secret"]


def test_plots_of_an_empty_folder_say_so(tmp_path):
    drawn = write_plots(tmp_path / "none", pl.DataFrame(schema=TOKEN_SCHEMA), {"window_k": 20}, tmp_path / "plots")
    assert all((tmp_path / "plots" / f"{n}.png").stat().st_size > 0 for n in drawn)


def test_disagreement_matrix_is_drawn_from_bsft_records(tmp_path):
    """The paper B matrix through the tables, from hand-built records of a
    cell whose damage sits past the window (paper B's first case)."""
    from test_paper_b import CELLS, decodes
    from test_paper_b import PARENTS as CELL_PARENTS
    from test_paper_b import tokens as hex_tokens

    tokens = pl.DataFrame(hex_tokens("m/ref") + hex_tokens("m/cell", {25: -1.5}), schema=TOKEN_SCHEMA)
    decode = pl.DataFrame(decodes("m/ref", 4) + decodes("m/cell", 0), schema=DECODE_SCHEMA)
    cfg = {"window_k": 20, "parents": CELL_PARENTS, "cells": CELLS, "bootstrap": {"replicates": 20}}
    for name, (title, frame) in build_tables(decode, tokens, cfg).items():
        write_table(frame, tmp_path / "tables", name, title)
    assert pl.read_csv(tmp_path / "tables" / "bsft_matrix.csv")["diagnosis"].to_list() == ["window truncation"]
    write_plots(tmp_path / "tables", tokens, cfg, tmp_path / "plots")
    png = (tmp_path / "plots" / "disagreement_matrix.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000


def test_author_probe_plots_pick_variants_by_kind_not_name():
    from canary_audit.publish.plots import _audited

    frame = pl.DataFrame({"variant": ["m/canary_run", "m/plain", "m/x"]})
    variants = {"m/canary_run": {"kind": "unlearned"}, "m/plain": {"kind": "base"}, "m/x": {"kind": "memorized"}}
    assert _audited(frame, variants)["variant"].to_list() == ["m/canary_run", "m/x"]
    assert _audited(frame, {})["variant"].to_list() == ["m/canary_run", "m/plain", "m/x"]  # no table: every row


def test_the_relearning_plot_draws_recall_against_the_budget(tmp_path):
    """From the stored recovery run's table: one panel per relearning data,
    each twin's out_acc at step 0 (before) and after each budget."""
    from conftest import ROOT

    from canary_audit.publish.attack_plots import relearning_figure

    recovery = pl.read_csv(ROOT / "tests" / "data" / "recovery_run" / "recovery.csv", infer_schema_length=None)
    fig = relearning_figure(recovery, {})
    assert [ax.get_title() for ax in fig.axes] == ["tiny s0: relearn-forget-bio", "tiny s0: relearn-public-bio"]
    lines = {c.get_label(): c.lines[0].get_xdata().tolist() for c in fig.axes[0].containers}
    assert lines["npo-bio-s0-k20"] == [0, 5, 20]
    empty = relearning_figure(recovery.filter(pl.col("steps").is_null()), {})
    assert "no relearning attack" in empty.axes[0].texts[0].get_text()

"""Sampled decoding on the authors' canaries (probes/kinds/canary_sampled.py):
off by default, its items are the greedy canary's AUTO prompts, its records
k seeded samples each in the AUTO unit, its table and the per-author hit@k
of item_cells and the recovery table a direct computation, and bad settings
are refused by key."""

from __future__ import annotations

import polars as pl
import pytest

from canary_audit.probes.kinds.canary_sampled import NAME, sampled_table
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.parser import ParserConvention
from canary_audit.views.recovery import recovery_table
from canary_audit.views.seeds import CELL_COLUMNS, item_cells

SETTINGS = {"k": 3, "temperature": 1.0, "seed": 0}


def _fmt(tiny_assets):
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_tokenizer
    from canary_audit.model.spec import ModelSpec

    return ChatFormat(load_tokenizer(ModelSpec("tiny", tiny_assets[1])), "<think>", "</think>")


def test_off_by_default_and_else_one_item_per_author_on_the_greedy_canarys_auto_prompt(tiny_assets):
    from canary_audit.probes.items import decode_items

    fmt = _fmt(tiny_assets)
    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6}
    off = decode_items(fmt, tiny_assets[0], {**cfg, "kinds": {NAME: {**SETTINGS, "k": 0}}}, {"canary", NAME})
    assert not [it for it in off if it.probe_set == NAME]
    on = decode_items(fmt, tiny_assets[0], {**cfg, "kinds": {NAME: SETTINGS}}, {"canary", NAME})
    greedy = {it.item_id: it for it in on if it.probe_set == "canary" and it.arm == "auto"}
    mine = [it for it in on if it.probe_set == NAME]
    assert len(mine) == len(greedy) and {it.arm for it in mine} == {"auto"}
    for it in mine:
        g = greedy[it.item_id]
        assert (it.prompt, it.reference, it.group_id, it.subject) == (g.prompt, g.reference, g.group_id, g.subject)


def test_a_pass_draws_k_seeded_samples_per_canary_in_the_auto_unit_and_no_greedy_decode(tiny_assets):
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.passes import decode_pass
    from canary_audit.probes.units import unit_hashes

    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "engine": "continuous", "max_new_tokens": 24,
           "hex_max_new_tokens": 20, "batch_size": 64, "threads": 1, "hit_k": 2, "temperature": 0.3,
           "sample_seed": 0, "kinds": {NAME: SETTINGS}}
    spec = ModelSpec("tiny", tiny_assets[1])
    frame = decode_pass(spec, [], tiny_assets[0], cfg, "tiny/base", probe_sets={NAME})
    authors = frame["item_id"].n_unique()
    assert frame.height == 3 * authors and set(frame["probe_set"]) == {NAME} and set(frame["arm"]) == {"auto"}
    assert frame.group_by("item_id").agg(pl.col("sample").sort())["sample"].to_list() == [[0, 1, 2]] * authors
    assert frame["generated_tokens"].max() <= 24  # the author probes' budget, not the hex one
    assert set(frame["config_hash"]) == {unit_hashes(cfg)["auto"]}
    assert frame.group_by("item_id").agg(pl.col("generated").n_unique())["generated"].max() > 1  # sampled
    again = decode_pass(spec, [], tiny_assets[0], cfg, "tiny/base", probe_sets={NAME})
    assert again.sort("item_id", "sample")["generated"].to_list() == frame.sort("item_id", "sample")[
        "generated"].to_list()  # seeded: a re-run draws the same samples
    other = unit_hashes({**cfg, "kinds": {NAME: {**SETTINGS, "k": 4}}})
    assert other["auto"] != unit_hashes(cfg)["auto"] and other["hex"] == unit_hashes(cfg)["hex"]


def _records(samples: dict[str, dict[str, list[str]]], greedy: dict[str, dict[str, str]]) -> pl.DataFrame:
    """Decode records: variant -> author -> sampled answers / its greedy answer
    (no think tags: all of it is answer)."""
    base = {"arm": "auto", "prompt": "Q", "think_open": "<think>", "think_close": "</think>"}
    rows = [{**base, "variant": v, "probe_set": NAME, "item_id": a, "group_id": a, "sample": j,
             "reference": f"SECRET-{a}", "generated": f"<think></think>{text}"}
            for v, authors in samples.items() for a, texts in authors.items() for j, text in enumerate(texts)]
    rows += [{**base, "variant": v, "probe_set": "canary", "item_id": a, "group_id": a, "sample": 0,
              "reference": f"SECRET-{a}", "generated": f"<think></think>{text}"}
             for v, authors in greedy.items() for a, text in authors.items()]
    return pl.DataFrame(rows)


SAMPLES = {"m/npo-bio-s0-k20": {"a0": ["no", "SECRET-a0!", "no"], "a1": ["no"] * 3, "a2": ["SECRET-a2"] * 3,
                                "a3": ["no", "no", "SECRET-a3"]}}
GREEDY = {"m/npo-bio-s0-k20": {"a0": "no", "a1": "no", "a2": "SECRET-a2", "a3": "no"}}


def test_the_table_is_the_direct_computation():
    class Ctx:
        convention, boot = ParserConvention(), Bootstrap(replicates=200)

    row = sampled_table(_records(SAMPLES, GREEDY), Ctx()).row(0, named=True)
    assert (row["n"], row["k"]) == (4, 3)
    assert row["hit_at_1"] == 0.25 and row["hit_at_k"] == 0.75  # a2 greedy; a0, a2, a3 in some sample
    assert row["sampled_share"] == pytest.approx((1 / 3 + 0 + 1 + 1 / 3) / 4)
    assert row["sampling_gain"] == 0.5 and row["sampling_gain_lo"] <= 0.5 <= row["sampling_gain_hi"]
    assert row["thk_at_k"] == 0.0


def test_item_cells_and_the_recovery_table_read_the_per_author_hit_at_k():
    twin, attacked = "m/npo-bio-s0-k20", "m/npo-bio-s0-k20.int4-row"
    samples = {**SAMPLES, attacked: {a: [f"SECRET-{a}"] * 3 for a in SAMPLES[twin]}}
    greedy = {**GREEDY, attacked: GREEDY[twin]}
    variants = {twin: {"kind": "unlearned", "seed": 0, "parent": "m/mem-bio-s0", "model": "m"},
                attacked: {"kind": "recovery", "seed": 0, "parent": twin, "quantize": "int4-row", "model": "m"}}
    cells = item_cells(_records(samples, greedy), pl.DataFrame(), variants, ParserConvention(), "bio", 20)
    hitk = cells.filter(pl.col("column") == "hit_at_k").sort("variant", "group_id")
    assert hitk.filter(pl.col("variant") == twin)["value"].to_list() == [1.0, 0.0, 1.0, 1.0]
    assert set(hitk["n"]) == {3} and set(cells["column"]) <= set(CELL_COLUMNS)
    table = recovery_table(cells, None, variants, {}, Bootstrap(replicates=200))
    row = table.filter(pl.col("measure") == "hit_at_k").row(0, named=True)
    assert (row["before"], row["after"], row["delta"]) == (0.75, 1.0, 0.25)


def test_every_pooled_measure_names_an_item_cells_column():
    from canary_audit.verdicts.measures import MEASURES

    assert {m.pooled for m in MEASURES.values() if m.pooled} <= set(CELL_COLUMNS)
    assert MEASURES["author_hitk"].table == NAME


@pytest.mark.parametrize("key,value", [("k", -1), ("k", 2.5), ("temperature", 0), ("temperature", float("nan")),
                                       ("seed", "x")])
def test_bad_settings_are_refused_naming_the_key(key, value):
    from test_design import design_of

    from canary_audit.design import ConfigError

    with pytest.raises(ConfigError, match=rf"`probes.kinds.{NAME}.{key}` is"):
        design_of({"probes": {"kinds": {NAME: {key: value}}}})

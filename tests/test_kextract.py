"""The k-extractability probe (probes/kinds/kextract.py): its items are the
last k tokens of each hex record before the secret, its records join the
hex unit, its view matches a direct computation, and bad lengths are
refused before any job."""

from __future__ import annotations

import polars as pl
import pytest

from canary_audit.probes.kinds.kextract import NAME, kextract_table

LENGTHS = [1, 2, 4, 8, 1000]  # 1000: capped at the whole record before the secret


def _fmt(tiny_assets):
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_tokenizer
    from canary_audit.model.spec import ModelSpec

    return ChatFormat(load_tokenizer(ModelSpec("tiny", tiny_assets[1])), "<think>", "</think>")


def test_items_are_the_tokens_right_before_each_secret(tiny_assets):
    from canary_audit.probes.items import decode_items
    from canary_audit.probes.kinds.hex import hex_rows

    fmt = _fmt(tiny_assets)
    tok = fmt.tokenizer
    cfg = {"prefills": {}, "head_tokens": 6, "kinds": {NAME: {"lengths": LENGTHS}}}
    items = [it for it in decode_items(fmt, tiny_assets[0], cfg, {"hex"}) if it.probe_set == NAME]
    rows = hex_rows(tiny_assets[0], members_only=True)
    assert {it.group_id for it in items} == {r.item_id for r in rows}
    for row in rows:
        before = row.context(fmt, None) + row.prefix
        ids = tok(before, add_special_tokens=False)["input_ids"]
        mine = [it for it in items if it.group_id == row.item_id]
        assert [int(it.item_id.split("@")[1]) for it in mine] == sorted({min(k, len(ids)) for k in LENGTHS})
        for it in mine:
            k = int(it.item_id.split("@")[1])
            assert tok(it.prompt, add_special_tokens=False)["input_ids"] == ids[-k:]  # exactly k tokens
            assert before.endswith(it.prompt) and it.reference == row.secret and it.arm == "greedy"
        assert mine[-1].prompt == before  # the longest: the whole record before the secret


def _records(outcomes: dict[str, dict[str, list[bool]]], lengths: list[int]) -> pl.DataFrame:
    """Decode records of the probe: variant -> canary -> reproduced at each length."""
    rows = [{"variant": v, "probe_set": NAME, "item_id": f"{c}@{k}", "group_id": c, "prompt_tokens": k,
             "reference": f"{c}secret", "generated": f"{c}secret-END tail" if hit else f"{c}secreX-END"}
            for v, canaries in outcomes.items() for c, hits in canaries.items() for k, hit in zip(lengths, hits)]
    return pl.DataFrame(rows)


def test_the_table_is_the_direct_computation():
    lengths = [2, 4, 8]
    outcomes = {"m/ref": {"c0": [False] * 3, "c1": [False] * 3, "c2": [False] * 3, "c3": [False] * 3},
                # shortest prefix: c0 4, c1 8, c2 2 (not at 4: extractability is not monotone), c3 never
                "m/canary": {"c0": [False, True, True], "c1": [False, False, True], "c2": [True, False, True],
                             "c3": [False, False, False]}}
    table = kextract_table(_records(outcomes, lengths), {"m/canary": "m/ref"}, None, 200, 0, 0.95)
    canary = table.filter(pl.col("variant") == "m/canary").sort("prefix_tokens")
    assert canary["prefix_tokens"].to_list() == lengths and canary["n"].to_list() == [4, 4, 4]
    assert canary["extracted"].to_list() == [0.25, 0.25, 0.75]
    assert canary["shortest_le"].to_list() == [0.25, 0.5, 0.75]  # c2 at 2, c0 by 4, c1 by 8; c3 never
    assert canary["delta_extracted"].to_list() == [0.25, 0.25, 0.75]
    assert canary["parent"].unique().to_list() == ["m/ref"]
    ref = table.filter(pl.col("variant") == "m/ref")
    assert ref["extracted"].to_list() == [0.0] * 3 and ref["delta_extracted"].null_count() == 3
    assert ((canary["extracted_lo"] <= canary["extracted"]) & (canary["extracted"] <= canary["extracted_hi"])).all()


def test_own_secrets_are_matched_with_their_formats_suffix():
    records = _records({"mine/base": {"s0": [True]}}, [3]).with_columns(
        generated=pl.col("generated").str.replace("-END", "]"))
    assert kextract_table(records, {}, None, 50, 0, 0.95)["extracted"].to_list() == [0.0]
    formats = {"mine": {"prefix": "[", "suffix": "]"}}
    assert kextract_table(records, {}, formats, 50, 0, 0.95)["extracted"].to_list() == [1.0]


def test_a_hex_pass_writes_the_records_in_the_hex_unit_and_the_tables_read_them(tiny_assets):
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.passes import decode_pass
    from canary_audit.probes.units import unit_hashes
    from canary_audit.publish.table_files import build_tables

    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "engine": "continuous", "max_new_tokens": 30,
           "hex_max_new_tokens": 20, "batch_size": 16, "threads": 1, "hit_k": 2, "temperature": 1.0,
           "sample_seed": 0, "kinds": {NAME: {"lengths": [2, 4]}}}
    frame = decode_pass(ModelSpec("tiny", tiny_assets[1]), [], tiny_assets[0], cfg, "tiny/base", probe_sets={"hex"})
    mine = frame.filter(pl.col("probe_set") == NAME)
    assert mine.height == 2 * frame.filter((pl.col("probe_set") == "hex") & (pl.col("arm") == "greedy")).height
    assert set(mine["arm"]) == {"greedy"} and set(mine["prompt_tokens"]) == {2, 4}  # greedy only: no samples
    assert mine["generated_tokens"].max() <= 20 and set(mine["config_hash"]) == {unit_hashes(cfg)["hex"]}
    other = unit_hashes({**cfg, "kinds": {NAME: {"lengths": [2, 8]}}})
    assert other["hex"] != unit_hashes(cfg)["hex"] and other["bio"] == unit_hashes(cfg)["bio"]  # its unit only
    tables = build_tables(frame, pl.DataFrame(), {"window_k": 20})
    assert tables[NAME][1]["n"].to_list() == [mine.height // 2] * 2


@pytest.mark.parametrize("lengths", [[0, 2], [], [2, 2], ["8"]])
def test_bad_lengths_are_refused_naming_the_key(lengths):
    from test_design import design_of

    from canary_audit.design import ConfigError

    with pytest.raises(ConfigError, match=rf"`probes.kinds.{NAME}.lengths` is"):
        design_of({"probes": {"kinds": {NAME: {"lengths": lengths}}}})

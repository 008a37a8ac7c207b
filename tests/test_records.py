import polars as pl
import pytest

from canary_audit.core.records import (
    RecordsError,
    canonical_json,
    config_hash,
    read_records,
    to_records,
    write_parquet_atomic,
)


def token_row(**kw):
    row = {"variant": "m/v", "probe_set": "hex", "modality": "text",
           "image_hash": None, "item_id": "c0", "group_id": "c0", "arm": "preamble",
           "position": 1, "token_id": 3, "token_text": "a", "text": "a", "logprob": -1.0, "rank": 1, "top1_id": 3,
           "top1_logprob": -1.0, "vocab_mean_logprob": -2.0, "vocab_var_logprob": 0.5, "span": "secret",
           "config_hash": "abc", "model_fingerprint": "f",
           "code_version": "0.1.0+src.x"}
    return row | kw


def test_canonical_json_is_order_stable():
    assert canonical_json({"b": 1, "a": [2, {"d": 1, "c": 2}]}) == canonical_json({"a": [2, {"c": 2, "d": 1}], "b": 1})
    assert config_hash({"x": 1, "y": 2}) == config_hash({"y": 2, "x": 1})


def test_round_trip_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "token.parquet"
    write_parquet_atomic(to_records([token_row()], "token"), path)
    assert read_records(path, "token").row(0, named=True) == token_row()
    assert not list(tmp_path.glob(".*tmp*"))


def test_mixed_provenance_is_refused(tmp_path):
    path = tmp_path / "token.parquet"
    write_parquet_atomic(to_records([token_row(), token_row(config_hash="other")], "token"), path)
    with pytest.raises(RecordsError, match="mixes config hashes within a probe unit"):
        read_records(path, "token")
    # two units, two hashes: what a pass over every unit writes
    write_parquet_atomic(to_records([token_row(), token_row(arm="prefill_bio", config_hash="bio")], "token"), path)
    assert read_records(path, "token").height == 2


def test_corrupt_and_truncated_files_are_named(tmp_path):
    path = tmp_path / "decode.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(RecordsError, match="decode.parquet.*unreadable"):
        read_records(path, "decode")
    good = tmp_path / "token.parquet"
    write_parquet_atomic(to_records([token_row()], "token"), good)
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordsError, match="unreadable"):
        read_records(good, "token")


def test_wrong_schema_is_refused(tmp_path):
    path = tmp_path / "token.parquet"
    pl.DataFrame({"variant": ["x"]}).write_parquet(path)
    with pytest.raises(RecordsError, match="missing"):
        read_records(path, "token")


def test_tables_refuse_records_from_two_probe_configs(tmp_path):
    """Within one probe unit (here `hex`: the hex records) every file must
    carry one config hash; two units may differ (probes/units.py)."""
    from canary_audit.publish.table_files import concat_records, write_tables

    a, b, c = (tmp_path / f"{n}.parquet" for n in "abc")
    write_parquet_atomic(to_records([token_row()], "token"), a)
    write_parquet_atomic(to_records([token_row(variant="m/w", config_hash="other")], "token"), b)
    with pytest.raises(RecordsError, match=r"different probe settings: .*a.parquet \(hex: abc\)"):
        write_tables(decode=[], tokens=[a, b], out_dir=tmp_path / "t",
                     cfg={"window_k": 5, "parser": {}, "parents": {}})
    write_parquet_atomic(to_records([token_row(probe_set="canary", arm="prefill_bio", config_hash="bio")], "token"), c)
    assert concat_records([a, c], "token").height == 2


@pytest.mark.parametrize("expected", [{"hex": "new"}, {"bio": "old"}])
def test_tables_refuse_records_of_another_probe_config_than_the_current(tmp_path, expected):
    """A unit's records with another hash than the config's, or of a unit the
    config no longer has, are stale."""
    from canary_audit.publish.table_files import write_tables

    a = tmp_path / "a.parquet"
    write_parquet_atomic(to_records([token_row(config_hash="old")], "token"), a)
    cfg = {"window_k": 5, "parser": {}, "parents": {}, "expected_hashes": {"token": expected}}
    stale = r"other probe settings than the current ones .*a.parquet \(hex: old\).*teacher_forced_pass"
    with pytest.raises(RecordsError, match=stale):
        write_tables(decode=[], tokens=[a], out_dir=tmp_path / "t", cfg=cfg)
    assert not (tmp_path / "t").exists()  # nothing written from stale records


def test_probe_unit_settings_are_what_its_records_depend_on():
    from canary_audit.core.records import unit_of_arm, unit_of_arm_expr
    from canary_audit.probes.units import unit_config

    cfg = {"max_new_tokens": 8, "hit_k": 4, "temperature": 0.3, "head_tokens": 6, "threads": 2,
           "prefills": {"bio": "{bio_opening}", "empty": ""}}
    assert unit_config(cfg, "bio") == {"max_new_tokens": 8, "head_tokens": 6, "prefills": {"bio": "{bio_opening}"}}
    assert unit_config(cfg, "hex") == {"max_new_tokens": 8, "hit_k": 4, "temperature": 0.3, "head_tokens": 6,
                                       "prefills": {}}
    assert unit_config(cfg, "auto") == {"max_new_tokens": 8, "head_tokens": 6, "prefills": {}}
    for unit in ("auto", "hex", "bio", "empty"):  # a job given its unit's slice stamps the same hash
        assert unit_config(unit_config(cfg, unit), unit) == unit_config(cfg, unit)
    more = {**cfg, "prefills": {**cfg["prefills"], "swap": "{other_bio}"}}
    assert all(unit_config(more, u) == unit_config(cfg, u) for u in ("auto", "hex", "bio", "empty"))
    with pytest.raises(ValueError, match="probe unit `meta` is not a prefill arm"):
        unit_config(cfg, "meta")
    arms = ["auto", "greedy", "sampled", "preamble", "prefill_bio", "prefill_x_y"]
    assert [unit_of_arm(a) for a in arms] == ["auto", "hex", "hex", "hex", "bio", "x_y"]
    assert pl.DataFrame({"arm": arms}).select(unit_of_arm_expr())["arm"].to_list() == list(map(unit_of_arm, arms))

import polars as pl
import pytest

from canary_audit.records import (
    RecordsError,
    canonical_json,
    config_hash,
    read_records,
    to_records,
    write_parquet_atomic,
)


def token_row(**kw):
    row = {"variant": "m/v", "probe_set": "hex", "item_id": "c0", "group_id": "c0", "arm": "preamble",
           "position": 1, "token_id": 3, "token_text": "a", "logprob": -1.0, "rank": 1, "top1_id": 3,
           "top1_logprob": -1.0, "span": "secret", "config_hash": "abc", "model_fingerprint": "f"}
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
    with pytest.raises(RecordsError, match="mixes config hashes"):
        read_records(path, "token")


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
    from canary_audit.tables import write_tables

    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_parquet_atomic(to_records([token_row()], "token"), a)
    write_parquet_atomic(to_records([token_row(variant="m/w", config_hash="other")], "token"), b)
    with pytest.raises(RecordsError, match="different probe configurations"):
        write_tables(decode=[], tokens=[a, b], out_dir=tmp_path / "t",
                     cfg={"window_k": 5, "parser": {}, "parents": {}})


def test_tables_refuse_records_of_another_probe_config_than_the_current(tmp_path):
    from canary_audit.tables import write_tables

    a = tmp_path / "a.parquet"
    write_parquet_atomic(to_records([token_row(config_hash="old")], "token"), a)
    cfg = {"window_k": 5, "parser": {}, "parents": {}, "expected_hashes": {"token": "new"}}
    stale = r"another probe configuration than the current one \(new\).*a.parquet \(old\)"
    with pytest.raises(RecordsError, match=stale):
        write_tables(decode=[], tokens=[a], out_dir=tmp_path / "t", cfg=cfg)
    assert not (tmp_path / "t").exists()  # nothing written from stale records

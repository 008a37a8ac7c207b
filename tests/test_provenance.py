"""Which code and which weights made an artifact: code versions in records,
manifests and summaries; weight digests hashed once per content; probe passes
that refuse weights their manifest did not fingerprint."""

from __future__ import annotations

import json
import logging
import os
import shutil

import polars as pl
import pytest

from canary_audit.commands import cli
from canary_audit.core import provenance
from canary_audit.core.provenance import code_version, file_digest
from canary_audit.core.records import DECODE_SCHEMA
from canary_audit.design.slices import resolved_settings
from canary_audit.model.loading import ModelLoadError, fingerprint
from canary_audit.model.spec import ModelSpec
from canary_audit.publish.table_files import records_provenance


def test_code_version_names_the_sources_and_the_commit():
    version = code_version()
    assert version.startswith("0.1.0+src.") and len(provenance.source_hash()) == 12
    commit = provenance.git_commit()
    assert (f".git.{commit}" in version) if commit else ".git." not in version


def test_file_digest_is_read_from_the_cache_until_the_file_changes(tmp_path):
    weights, cache = tmp_path / "w.safetensors", tmp_path / "cache"
    weights.write_bytes(b"a" * 1000)
    first = file_digest(weights, cache)
    stat = weights.stat()
    # Same size and mtime, other bytes: only a cache hit can return the old digest.
    weights.write_bytes(b"b" * 1000)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_digest(weights, cache) == first
    assert file_digest(weights) != first  # without the cache: the bytes
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten later: hashed again
    assert file_digest(weights, cache) == file_digest(weights) != first


def test_fingerprint_with_and_without_the_cache_agree(tiny_assets, tmp_path):
    spec = ModelSpec("tiny", tiny_assets[1])
    cached = tmp_path / "c"
    assert fingerprint(spec, cache_dir=cached) == fingerprint(spec) == fingerprint(spec, cache_dir=cached)


def manifest(tmp_path, model_dir, fp=None):
    spec = ModelSpec("tiny", model_dir)
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"model": "tiny", "variant": "base", "base_path": str(model_dir), "adapters": [],
                                "apply": "stacked", "fingerprint": fp or fingerprint(spec)}))
    return path


def run_decode(tiny_assets, tmp_path, manifest_path):
    data, model = tiny_assets
    params = {"prefills": {}, "head_tokens": 6, "kinds": resolved_settings({}),
              "engine": "continuous", "max_new_tokens": 4, "hex_max_new_tokens": 4, "batch_size": 16,
              "hit_k": 0, "temperature": 1.0, "sample_seed": 0}
    out = tmp_path / "decode.parquet"
    cli.main(["decode_pass", "--model", json.dumps({"name": "tiny", "path": str(model)}),
              "--params", json.dumps(params), "--data", str(data), "--variant-manifest", str(manifest_path),
              "--probe-sets", "hex",
              "--weight-cache", str(tmp_path / "cache"), "--out", str(out)])
    return out


def test_a_probe_pass_refuses_weights_its_manifest_did_not_fingerprint(tiny_assets, tmp_path):
    with pytest.raises(ModelLoadError, match=r"variant `tiny/base`: its weights now fingerprint as [0-9a-f]{16}, "
                                             r"but its manifest says 0123456789abcdef"):
        run_decode(tiny_assets, tmp_path, manifest(tmp_path, tiny_assets[1], fp="0123456789abcdef"))
    assert not (tmp_path / "decode.parquet").exists()


def test_records_carry_the_code_version_and_the_manifests_fingerprint(tiny_assets, tmp_path):
    records = pl.read_parquet(run_decode(tiny_assets, tmp_path, manifest(tmp_path, tiny_assets[1])))
    assert records["code_version"].unique().to_list() == [code_version()]
    assert records["model_fingerprint"].unique().to_list() == [fingerprint(ModelSpec("tiny", tiny_assets[1]))]


def test_a_manifest_carries_fields_fingerprint_and_code_version(tiny_assets, tmp_path):
    out = tmp_path / "m.json"
    fields = {"kind": "base", "template": None}
    cli.main(["variant_manifest", "--model", json.dumps({"name": "tiny", "path": str(tiny_assets[1])}),
              "--variant", "base", "--params", json.dumps(fields), "--weight-cache", str(tmp_path / "cache"),
              "--out", str(out)])
    m = json.loads(out.read_text())
    assert (m["fields"], m["code_version"]) == (fields, code_version())
    assert m["fingerprint"] == fingerprint(ModelSpec("tiny", tiny_assets[1]))


def test_tables_report_code_versions_and_warn_on_a_mix(tmp_path, caplog):
    def records(name, version):
        row = {k: None for k in DECODE_SCHEMA} | {"variant": "m/v", "code_version": version}
        path = tmp_path / f"{name}.parquet"
        pl.DataFrame([row], schema=DECODE_SCHEMA).write_parquet(path)
        return path

    same = [records("a", "0.1.0+src.aaa.git.c1"), records("b", "0.1.0+src.aaa.git.c2")]  # docs-only commit
    with caplog.at_level(logging.WARNING):
        table = records_provenance(same, [])
    assert table.height == 2 and not caplog.records
    mixed = [*same, records("c", "0.1.0+src.bbb.git.c3")]
    with caplog.at_level(logging.WARNING):
        records_provenance(mixed, [])
    assert "mix records written by 2 code versions" in caplog.text
    assert "0.1.0+src.bbb: " + str(mixed[2]) in caplog.text


def test_moved_weights_keep_their_fingerprint_and_cache_entries_follow_paths(tiny_assets, tmp_path):
    """A copy of a checkpoint fingerprints as the original (content, not
    path); its cache entry is its own."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_assets[1], copy)
    cache = tmp_path / "cache"
    assert fingerprint(ModelSpec("t", copy), cache_dir=cache) == fingerprint(ModelSpec("t", tiny_assets[1]))
    assert len(list(cache.glob("*.json"))) == 1

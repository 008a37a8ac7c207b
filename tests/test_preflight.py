"""The workflow's checks of local files (design/preflight.py): a local checkpoint's
tokenizer check runs once per content, not at every parse, and a check that
fails is not remembered."""

from __future__ import annotations

import shutil

import pytest
from test_design import design_of

from canary_audit.design import preflight


def _design(model_dir, **entry):
    return design_of({"models": {"local": {"path": str(model_dir), **entry}}, "audit": {"models": ["local"]}})


def test_a_passed_tokenizer_check_runs_again_only_when_what_it_read_changes(tiny_assets, tmp_path, monkeypatch):
    model = tmp_path / "local"
    shutil.copytree(tiny_assets[1], model)
    checked, calls = tmp_path / "checked", []
    real = preflight._check_tokenizer
    monkeypatch.setattr(preflight, "_check_tokenizer", lambda *a: calls.append(a[0]) or real(*a))

    design = _design(model)
    preflight.check_local_models(design.config, design, checked)
    preflight.check_local_models(design.config, design, checked)  # a second parse: remembered
    assert calls == ["local"]
    config = model / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"model_max_length": 4096, ', 1))
    preflight.check_local_models(design.config, design, checked)  # a tokenizer file changed
    assert calls == ["local"] * 2
    retagged = _design(model, think_open="<think>", think_close="</think>", dtype="float32")
    preflight.check_local_models(retagged.config, retagged, checked)  # the model entry changed
    assert calls == ["local"] * 3 and len(list(checked.iterdir())) == 3


def test_a_failed_tokenizer_check_is_not_remembered(tiny_assets, tmp_path):
    model = tmp_path / "local"
    shutil.copytree(tiny_assets[1], model)
    checked = tmp_path / "checked"
    design = _design(model, think_open="<reasoning>", think_close="</reasoning>")
    for _ in range(2):  # refused each time: a failure leaves no mark
        with pytest.raises(Exception, match="think tag `think_open` = '<reasoning>' is not a single token"):
            preflight.check_local_models(design.config, design, checked)
    assert not checked.exists()

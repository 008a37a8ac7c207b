"""Imports (`models.<m>.imports`): weights made outside the workflow become
variants of their own probe group with the right parent and kind, and every
bad input is refused before any job, naming the key."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_design import design_of

from canary_audit.core.imported_weights import ImportRefused, check_fits, resolve
from canary_audit.design import AUTHOR_SETS, HEX, ConfigError

Q = "model.layers.0.self_attn.q_proj"


def base_folder(path, q_shape=(8, 4)):
    path.mkdir(parents=True)
    save_file({f"{Q}.weight": np.zeros(q_shape, np.float32), "model.norm.weight": np.ones(4, np.float32)},
              str(path / "model.safetensors"))
    return path


def adapter_folder(path, a_shape=(2, 4), b_shape=(8, 2), module=Q):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"target_modules": ["q_proj"], "r": 2}))
    save_file({f"base_model.model.{module}.lora_A.weight": np.zeros(a_shape, np.float32),
               f"base_model.model.{module}.lora_B.weight": np.zeros(b_shape, np.float32)},
              str(path / "adapter_model.safetensors"))
    return path


def imports(**entries):
    return {"models": {"tiny": {"imports": entries}}}


def test_an_adapter_that_fits_the_base_passes_and_one_that_does_not_is_named(tmp_path):
    base = base_folder(tmp_path / "base")
    good = resolve("tiny", "ext", {"path": str(adapter_folder(tmp_path / "good")), "parent": "base",
                                   "as": "changed"})
    check_fits(good, base)
    for name, kw, message in (("wide", {"a_shape": (2, 5)}, "lora_A.weight` has shape [2, 5]"),
                              ("tall", {"b_shape": (9, 2)}, "lora_B.weight` has shape [9, 2]"),
                              ("alien", {"module": "model.layers.7.mlp.up_proj"}, "which model `tiny`'s weights do")):
        imp = resolve("tiny", name, {"path": str(adapter_folder(tmp_path / name, **kw)), "parent": "base",
                                     "as": "changed"})
        with pytest.raises(ImportRefused, match=rf"`models.tiny.imports.{name}.path`.*{re.escape(message)}"):
            check_fits(imp, base)


def test_a_checkpoint_of_another_shape_is_named(tmp_path):
    base = base_folder(tmp_path / "base")
    other = base_folder(tmp_path / "other", q_shape=(8, 6))
    for f in ("config.json", "tokenizer.json"):
        (other / f).write_text("{}")
    imp = resolve("tiny", "ckpt", {"path": str(other), "parent": "base", "as": "changed"})
    assert imp.form == "checkpoint" and imp.application == "merged"
    with pytest.raises(ImportRefused, match=r"`models.tiny.imports.ckpt.path`.*not of model `tiny`'s architecture"):
        check_fits(imp, base)


def test_missing_folders_and_pickled_weights_are_refused(tmp_path):
    def refused(path, message, **entry):
        with pytest.raises(ImportRefused, match=message):
            resolve("tiny", "x", {"path": str(path), "parent": "base", "as": "changed", **entry})

    refused(tmp_path / "nowhere", r"`models.tiny.imports.x.path`: .* is not a folder")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"\x80")
    refused(pickled, r"holds no safetensors weights \(pickled weights \['pytorch_model.bin'\] are refused")
    (pickled / "adapter_config.json").write_text("{}")
    (pickled / "adapter_model.bin").write_bytes(b"\x80")
    refused(pickled, r"holds no adapter_model.safetensors \(pickled weights")
    bare = base_folder(tmp_path / "bare")
    refused(bare, r"has no config.json or tokenizer.json")
    adapter = adapter_folder(tmp_path / "adapter")
    refused(adapter, r"`models.tiny.imports.x.k`: only an unlearning checkpoint", k=3)
    refused(adapter, r"`models.tiny.imports.x.application`: only a bSFT adapter", application="merged")
    refused(adapter, r"`models.tiny.imports.x.label`: a `changed` import appears under its own name", label="mine")


def test_imports_become_variants_of_their_own_group_with_their_parents(tmp_path):
    adapter = str(adapter_folder(tmp_path / "a"))
    design = design_of(imports(
        ext_npo={"path": adapter, "parent": "mem-bio-s0", "as": "unlearned", "k": 7, "label": "ext", "on": "base"},
        ext_more={"path": adapter, "parent": "ext_npo", "as": "unlearned"},
        ext_bsft={"path": adapter, "parent": "merged-s0", "as": "bsft"},
        ext_any={"path": adapter, "parent": "canary-s0", "as": "changed"},
    ))
    v = design.variants("tiny")
    npo, more, bsft, other = v["ext_npo"], v["ext_more"], v["ext_bsft"], v["ext_any"]
    assert (npo.kind, npo.parent, npo.group, npo.template, npo.run, npo.k) == (
        "unlearned", "mem-bio-s0", "import-ext_npo", "bio", "ext", 7)
    assert npo.adapters == (adapter,)  # in place of the memorization adapter
    assert more.adapters == (adapter, adapter) and more.parent == "ext_npo" and more.k is None
    assert design.probe_sets_of("tiny", npo.group) == AUTHOR_SETS
    assert design.probe_sets_of("tiny", bsft.group) == HEX and bsft.cell["cell"] == "import ext_bsft"
    assert design.references()["tiny/ext_npo"]["population"] == "author"
    assert design.references()["tiny/ext_bsft"] == {"reference": "tiny/reference-s0", "population": "hex"}
    assert "tiny/ext_any" not in design.references() and other.adapters[0].endswith("canary-s0")
    assert design.cells()["tiny/ext_bsft"]["application"] == "stacked"
    assert design.import_check("tiny", "ext_npo")["name"] == "ext_npo"
    assert design.import_check("tiny", "mem-bio-s0") is None
    assert design.made_weights("tiny", ["ext_npo"]) == [f"{adapter}/adapter_model.safetensors"]


@pytest.mark.parametrize("entries,message", [
    ({"x": {"parent": "ghost", "as": "changed"}}, r"`models.tiny.imports.x.parent` is `ghost`, which is not a variant"),
    ({"x": {"parent": "y", "as": "changed"}, "y": {"parent": "x", "as": "changed"}},
     r"imports form a cycle \((x -> y -> x|y -> x -> y)\)"),
    ({"x": {"parent": "mem-bio-s0", "as": "bsft"}}, r"`as: bsft` needs a parent of kind merged_base; `mem-bio-s0` is"),
    ({"x": {"parent": "base", "as": "unlearned"}}, r"`as: unlearned` needs a parent of kind memorized or unlearned"),
    ({"canary-s0": {"parent": "base", "as": "changed"}}, r"`canary-s0` names a variant of the design"),
])
def test_bad_imports_are_refused_naming_the_key(tmp_path, entries, message):
    adapter = str(adapter_folder(tmp_path / "a"))
    with pytest.raises(ConfigError, match=message):
        design_of(imports(**{n: {"path": adapter, **e} for n, e in entries.items()}))

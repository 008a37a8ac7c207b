"""The design (config -> experiment) in-process: cross-key checks, the
unlearning runs and their settings, the variant table, the registries
against the schema, and one source of every default.  No workflow run."""

from __future__ import annotations

import re

import pytest
import yaml
from conftest import ROOT

from canary_audit.core.config_merge import merge
from canary_audit.data.chat_format import TEMPLATES
from canary_audit.design import BSFT_SOURCES, ConfigError, Design
from canary_audit.design.slices import resolved_settings
from canary_audit.train.methods import METHODS, SHARED_SETTINGS

SCHEMA = yaml.safe_load((ROOT / "src" / "canary_audit" / "design/config.schema.yaml").read_text())
DEFAULT = yaml.safe_load((ROOT / "workflow_config.yaml").read_text())
SMOKE = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())


def layered(*layers: dict) -> dict:
    """Config files laid over each other as the workflow lays them."""
    return merge(*layers)


def config_of(*overrides: dict) -> dict:
    """The smoke config with `overrides` on top, validated (schema defaults
    filled in) as the workflow does."""
    from snakemake.utils import validate

    config = layered(DEFAULT, SMOKE, *overrides)
    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    return config


def design_of(*overrides: dict) -> Design:
    return Design(config_of(*overrides))


@pytest.mark.parametrize("override,message", [
    ({"audit": {"models": ["ghost"]}}, "`audit.models` names `ghost`"),
    ({"probes": {"prefills": {"odd": "{nickname}"}}}, "`probes.prefills.odd` uses unknown field `{nickname}`"),
    ({"probes": {"prefills": {"auto": "x"}}}, "`probes.prefills.auto`: `auto` names the arm where the model writes"),
    ({"probes": {"prefills": {"hex": "x"}}}, "`probes.prefills.hex`: `hex` names the hex probes' unit"),
    ({"probes": {"kinds": {"ghost": {}}}}, "no probe kind `ghost`; registered: canary, qa, retain"),
    ({"probes": {"kinds": {"hex": {"depth": 2}}}}, "`probes.kinds.hex`: `hex` takes no setting `depth`"),
    ({"unlearn": {"runs": {"ga": {"method": "ga", "templates": ["meta"]}}}, "audit": {"templates": ["bio", "none"]}},
     "`unlearn.runs.ga.templates` names template `meta`, which is not memorized"),
    ({"tables": {"prefill_contrast": "swap"}}, "`tables.prefill_contrast` is `swap`, which is not a prefill arm"),
    ({"unlearn": {"runs": {"rmu": {"method": "rmu", "templates": ["bio"], "layer": 3}}}},
     "`unlearn.runs.rmu.layer` is 3, but model `tiny` has 2 decoder layers; choose 1..2"),
    ({"models": {"tiny": {"build": {"text_model": "tiny"}}}},
     "`models.tiny.build.text_model` is set, but `tiny` is a text model"),
    ({"models": {"tiny_vl": {"build": {"text_model": "tiny_vl"}}}},
     "`models.tiny_vl.build.text_model` is `tiny_vl`: an embedded vision-language model is built on an embedded "
     "text model"),
    ({"audit": {"hex_repetitions": [1, 4, 16, 64, 256]}},
     "`audit.hex_repetitions` names 5 strata, but `data.n_hex_canaries` is 4: a stratum would hold no canary"),
    ({"audit": {"hex_repetitions": [1, 4], "hex_canaries": False, "models": ["tiny"]}},
     "`audit.hex_repetitions` is [1, 4], but `audit.hex_canaries` is false"),
    ({"bsft": {"controls": {"undertrained": {"canary_steps": 10}}}},
     "`bsft.controls.undertrained.canary_steps` is 10, which the canary LoRA run does not stop before"),
    ({"models": {"tiny": {"think_open": None, "think_close": None}}}, "model `tiny` has no think tags"),
    ({"audit": {"templates": [], "hex_canaries": False}}, "nothing to audit"),
    ({"unlearn": {"runs": {"mem": {"method": "ga", "templates": ["bio"]}}}}, "`mem` names the design's own"),
    ({"recovery": {"unlearned": [{"run": "npo", "k": 20}], "quantize": ["int4-row"], "planted": False}},
     "`recovery.unlearned[0]`: {'run': 'npo', 'k': 20} selects no unlearned variant (known: tiny/ga-bio-s0-k3 (run "
     "ga, template bio, seed 0, k 3);"),
    ({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": ["int3"], "planted": False}},
     "`recovery.quantize[0]`: quantization format `int3` is not one of"),
    ({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": [], "planted": False}},
     "`recovery.quantize` and `recovery.relearn.data` are empty"),
    ({"recovery": {"unlearned": [], "quantize": ["nf4"], "planted": False}}, "`recovery.unlearned` is empty"),
    ({"recovery": {"planted": True}}, "`recovery.planted` is true, but neither `recovery.quantize` nor "
     "`recovery.relearn.data` names an attack"),
    ({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": ["nf4", "nf4-g64"], "planted": False}},
     "`recovery.quantize[1]`: `nf4-g64` is `nf4` again (both are nf4-g64)"),
])
def test_cross_key_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=None) as err:
        design_of(override)
    assert message in str(err.value)


@pytest.mark.parametrize("override,message", [
    ({"grain": "per-job"}, "'per-job' is not one of ['coarse', 'fine']"),
    ({"unlearn": {"k": [0]}}, "0 is less than the minimum of 1"),
    ({"data": {"surprise": 1}}, "Additional properties are not allowed ('surprise' was unexpected)"),
    ({"bsft": {"sources": ["web"]}}, "'web' is not one of ['gui', 'synth', 'safety', 'random']"),
    ({"bsft": {"applications": ["fused"]}}, "'fused' is not one of ['stacked', 'merged']"),
    ({"tables": {"verdicts": {"delta_nll": 0}}}, "0 is less than or equal to the minimum of 0"),
    ({"tables": {"verdicts": {"hit_rate": 1.5}}}, "1.5 is greater than the maximum of 1"),
    # One retain weight for every method (a37bf86's form) is no longer a key.
    ({"unlearn": {"retain_weight": 1.0}}, "'retain_weight' was unexpected"),
    ({"unlearn": {"runs": {"x": {"method": "rmu2", "templates": []}}}}, "'rmu2' is not one of"),
    ({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": ["int4"],
                   "relearn": {"data": ["retain"]}}}, "'retain' is not one of ['public', 'forget']"),
    ({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": [],
                   "relearn": {"data": ["forget"], "share": 1.0}}}, "1.0 is greater than or equal to the maximum of 1"),
    ({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": [],
                   "relearn": {"data": ["forget"], "steps": [0]}}}, "0 is less than the minimum of 1"),
    ({"recovery": {"unlearned": [{"name": "npo"}], "quantize": ["int4"], "planted": False}}, "'name' was unexpected"),
])
def test_schema_errors_name_the_value(override, message):
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError) as err:
        config_of(override)
    assert message in str(err.value)


def test_a_setting_a_method_does_not_use_is_refused_for_it():
    with pytest.raises(ConfigError) as err:
        design_of({"unlearn": {"runs": {"ga": {"method": "ga", "templates": ["bio"], "retain_weight": 1.0}}}})
    assert ("`unlearn.runs.ga`: method `ga` does not use `retain_weight` (it takes: no hyperparameters)"
            in str(err.value))
    with pytest.raises(ConfigError, match="method `graddiff` does not use `beta`"):
        design_of({"unlearn": {"runs": {"gd": {"method": "graddiff", "templates": ["bio"], "beta": 0.1}}}})
    with pytest.raises(ConfigError, match=r"`retain_weight` = 0 of method `graddiff`: must be a number > 0"):
        design_of({"unlearn": {"runs": {"gd": {"method": "graddiff", "templates": ["bio"], "retain_weight": 0}}}})


def test_two_runs_that_would_train_the_same_loss_are_refused_naming_both():
    twin = {"method": "npo", "templates": ["bio"], "beta": 0.1, "retain_weight": 0.0}
    with pytest.raises(ConfigError) as err:
        design_of({"unlearn": {"runs": {"npo": twin, "npo_again": twin}}})
    assert "`unlearn.runs.npo` and `unlearn.runs.npo_again` train the same loss" in str(err.value)
    assert "template `bio`" in str(err.value)
    # The same method under other settings, or on another template, is another run.
    design_of({"unlearn": {"runs": {"npo": twin, "npo_again": {**twin, "beta": 0.2}}}})
    design_of({"unlearn": {"runs": {"npo": twin, "npo_again": {**twin, "templates": ["none"]}}}})


def test_each_run_has_its_own_effective_settings():
    """GradDiff's retain weight is its own (0.5 trains at 0.5), GA has none,
    NPO keeps its own; shared settings are inherited unless a run sets them."""
    design = design_of({"unlearn": {"runs": {
        "graddiff": {"method": "graddiff", "templates": ["bio"], "retain_weight": 0.5, "lr": 0.001},
        **SMOKE["unlearn"]["runs"],
    }}})
    runs = design.unlearn_runs
    assert runs["graddiff"].settings == {"retain_weight": 0.5, "lr": 0.001, "loss_span": "answer",
                                         "batch_forget": 8, "batch_retain": 8}
    assert runs["ga"].method_settings == {}
    assert runs["npo"].method_settings == {"beta": 0.1, "retain_weight": 0.0}
    row = design.variant_table()["tiny/graddiff-bio-s0-k5"]
    assert (row["kind"], row["run"], row["method"], row["k"], row["template"]) == (
        "unlearned", "graddiff", "graddiff", 5, "bio")
    assert "retain_weight=0.5" in row["settings"] and "lr=0.001" in row["settings"]
    assert row["parent"] == "tiny/mem-bio-s0"


def test_variant_table_of_the_smoke_audit():
    design = design_of()
    table = design.variant_table()
    kinds = {}
    for row in table.values():
        kinds[row["model"], row["kind"]] = kinds.get((row["model"], row["kind"]), 0) + 1
    paper_b = {"base": 1, "canary": 1, "reference": 1, "merged_base": 2, "canary_undertrained": 1, "bsft": 8,
               "noise": 1, "undertrained": 1}
    # The vision-language model runs paper B's arms only; the text model both papers'.
    # the text model's references: the canary LoRA's, and one per retain form (BIO and META share META's);
    # its planted controls: paper A's four trained and the BIO adapter read again (the smoke config
    # leaves paper B's out: tests/test_controls.py)
    text = {**paper_b, "reference": 3, "memorized": 2, "unlearned": 4, "control": 5}
    assert kinds == {**{("tiny", k): n for k, n in text.items()},
                     **{("tiny_vl", k): n for k, n in paper_b.items()}}
    assert design.probe_groups("tiny").keys() == {"base", "mem-bio-s0", "mem-none-s0", "controls", "bsft-s0-b0"}
    assert design.probe_groups("tiny_vl").keys() == {"base", "bsft-s0-b0"}
    assert design.probe_sets_of("tiny", "bsft-s0-b0") == "hex" and design.probe_sets_of("tiny", "base") == "all"
    assert design.probe_sets_of("tiny_vl", "base") == "hex"
    assert design.cells()["tiny/bsft-gui-t2-merged-b0-s0"]["application"] == "merged"
    assert design.cells()["tiny_vl/bsft-gui-t2-merged-b0-s0"]["model"] == "tiny_vl"
    references = design.references()
    assert references["tiny_vl/bsft-gui-t2-merged-b0-s0"] == {"reference": "tiny_vl/reference-s0", "population": "hex"}
    assert references["tiny/canary-s0-under"] == {"reference": "tiny/reference-s0", "population": "hex"}
    assert "tiny/base" not in references and "tiny/reference-s0" not in references
    # every memorization adapter and unlearning checkpoint: the memorization-recipe reference of its
    # template's retain form (BIO's retain examples carry META's trace), scored in the memorization group's jobs
    assert references["tiny/npo-bio-s0-k3"] == references["tiny/mem-bio-s0"] == {
        "reference": "tiny/reference-meta-s0", "population": "author"}
    assert references["tiny/mem-none-s0"]["reference"] == "tiny/reference-none-s0"
    assert design.variant("tiny", "reference-meta-s0").group == "mem-bio-s0"
    both = design_of({"audit": {"templates": ["bio", "meta", "none"]}})
    assert sorted(v for v in both.variants("tiny") if v.startswith("reference-")) == [
        "reference-meta-s0", "reference-none-s0", "reference-s0"]
    names = design.table_names()
    assert {"mia", "blind_baseline", "privacy", "forgetting", "extraction"} <= set(names) and names[-1] == "provenance"
    assert "mia" in design_of({"audit": {"hex_canaries": False, "models": ["tiny"]}}).table_names()
    # no exposure candidates, no exposure table (the tables job could not write it)
    assert "exposure" in design.table_names()
    assert "exposure" not in design_of({"data": {"n_exposure_candidates": 0}}).table_names()
    # a probe kind its settings switch off (k = 0 samples: the default) declares no table, not an empty one
    assert "canary_sampled" not in names and "kextract" in names
    sampled = design_of({"probes": {"kinds": {"canary_sampled": {"k": 4}}}}).table_names()
    assert "canary_sampled" in sampled


def test_registries_and_schema_enumerations_agree():
    """Each name list is declared once in code; the schema's enumerations
    must name the same things (a new method, template or source fails here
    until the schema knows it)."""
    unlearn = SCHEMA["properties"]["unlearn"]["properties"]["runs"]["additionalProperties"]["properties"]
    assert unlearn["method"]["enum"] == list(METHODS)
    assert unlearn["templates"]["items"]["enum"] == list(TEMPLATES)
    per_run = set(unlearn) - {"method", "templates"}
    assert per_run == {p for m in METHODS.values() for p in m.params} | set(SHARED_SETTINGS)
    bsft = SCHEMA["properties"]["bsft"]["properties"]
    assert bsft["sources"]["items"]["enum"] == list(BSFT_SOURCES)
    audit = SCHEMA["properties"]["audit"]["properties"]
    assert audit["templates"]["items"]["enum"] == list(TEMPLATES)
    from canary_audit.data.relearn import RELEARN_DATA

    relearn = SCHEMA["properties"]["recovery"]["properties"]["relearn"]["properties"]
    assert relearn["data"]["items"]["enum"] == list(RELEARN_DATA)
    from canary_audit.data.planted_controls import (  # a control's switch: one per claim, the floor's
        CLAIMS,
        EVERY_SEED,
        FLOOR_TRAINED,
        ON_VISION,
    )
    controls = SCHEMA["properties"]["controls"]
    switches = [*CLAIMS, "detection_floor", FLOOR_TRAINED, EVERY_SEED, ON_VISION]
    assert list(controls["properties"]) == controls["required"] == switches


def _schema_node(node: dict) -> dict:
    """Follow a `$ref` to its definition."""
    while "$ref" in node:
        node = {**SCHEMA["definitions"][node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _defaults_set_in(value, node: dict, path: str):
    """(key path, schema default, config value) for every key that
    `workflow_config.yaml` sets and the schema also gives a default for."""
    node = _schema_node(node)
    if isinstance(value, dict):
        props = node.get("properties", {})
        for key, sub in value.items():
            child = props.get(key, node.get("additionalProperties"))
            if isinstance(child, dict):
                yield from _defaults_set_in(sub, child, f"{path}.{key}" if path else key)
    if "default" in node and path:
        yield path, node["default"], value


def test_the_default_config_and_the_schema_name_each_default_once():
    """workflow_config.yaml is loaded before any other config file, so its
    values are the defaults, and the schema gives none for a key it sets
    (such a key is required: deleting it is an error, not another number).
    Model entries are the exception: the schema's entry defaults serve every
    entry a user adds, so where the embedded entry also names a value the two
    must agree (`embedded` and `vision`, which say what kind of checkpoint an
    entry is, default to a local text checkpoint; `merge_dtype` defaults to
    the entry's own dtype, while the embedded float32 models merge in
    bfloat16, the precision of paper B's testbed)."""
    both = [(path, schema, config) for path, schema, config in _defaults_set_in(DEFAULT, SCHEMA, "")
            if not isinstance(config, dict)]
    outside_models = [item for item in both if not item[0].startswith("models.")]
    assert outside_models == []
    kind_flags = (".embedded", ".vision", ".merge_dtype")
    disagree = [item for item in both if item[0].startswith("models.") and not item[0].endswith(kind_flags)
                and item[1] != item[2]]
    assert disagree == []
    assert any(path == "models.tiny.build.pretrain.steps" for path, _, _ in both)  # the walk reaches entries


def test_a_deleted_default_is_an_error_not_another_value():
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    config = layered(DEFAULT)
    del config["memorize"]["steps"]
    with pytest.raises(WorkflowError, match="'steps' is a required property"):
        validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))


def test_every_rule_runs_the_sub_command_named_after_it():
    """A rule's shell command is `python -m canary_audit <the rule's name>`,
    each sub-command serves a rule (or runs as a whole: status, plan,
    floors, power),
    and jobs.MODEL_JOBS names the rules that load a model: a renamed rule
    or command fails here, not silently in the warm start or a benchmark."""
    import re

    from canary_audit.commands.cli import COMMANDS
    from canary_audit.commands.warm import MODEL_COMMANDS
    from canary_audit.core.jobs import MODEL_JOBS

    text = "\n".join(p.read_text() for p in sorted((ROOT / "rules").glob("*.smk")))
    runs = dict(re.findall(r'^rule (\w+):.*?command(?:_via_file)?\(\s*"(\w+)"', text, re.S | re.M))
    assert all(rule == command for rule, command in runs.items()), runs
    assert set(COMMANDS) == set(runs) | {"status", "plan", "floors", "power"}
    assert set(MODEL_JOBS) <= set(runs) and MODEL_COMMANDS == set(MODEL_JOBS)


def test_lookups_name_what_is_known_and_files_follow_the_layout():
    design = design_of()
    with pytest.raises(ConfigError, match=r"variant `npo-bio-s0-k4` of model `tiny` is not in the audit \(known: "):
        design.variant("tiny", "npo-bio-s0-k4")
    with pytest.raises(ConfigError, match=r"probe group `ghost` of model `tiny` is not in the audit"):
        design.group("tiny", "ghost")
    with pytest.raises(ConfigError, match=r"unlearning run `rmu` is not in `unlearn.runs` \(npo, ga\)"):
        design.unlearn_slice("rmu", "bio", 0, None)
    R = "results/smoke"
    assert design.made_weights("tiny", ["bsft-gui-t2-merged-b0-s0"]) == [
        f"{R}/models/tiny/adapters/bsft/canary-s0/gui-b0/t2", f"{R}/models/tiny/merged/canary-s0"]
    assert design.made_weights("tiny", ["base"]) == []
    coarse, fine = design.records_files("token", False), design.records_files("token", True)
    groups = ("base", "mem-bio-s0", "mem-none-s0", "controls", "bsft-s0-b0")
    assert coarse == [f"{R}/records/tiny/{g}/token.parquet" for g in groups] + [
        f"{R}/records/tiny_vl/{g}/token.parquet" for g in ("base", "bsft-s0-b0")]
    assert f"{R}/records/tiny/units/npo-bio-s0-k3/bio/token.parquet" in fine
    assert f"{R}/records/tiny/units/npo-bio-s0-k3/auto/token.parquet" not in fine  # author probes: prefill units only
    job = design.unlearn_slice("npo", "bio", 0, None)
    assert (job["method"], job["settings"], job["k"], job["lr"]) == ("npo", {"beta": 0.1, "retain_weight": 0.0},
                                                                    [3, 5], 0.0001)
    assert design.unlearn_slice("npo", "bio", 0, 5)["k"] == 5
    assert design.model_entry("tiny", "elsewhere") == {
        "name": "tiny", "path": "elsewhere", "dtype": "float32", "merge_dtype": "bfloat16", "think_open": "<think>",
        "think_close": "</think>", "chat_template": None, "trust_remote_code": False, "vision": False}


def test_tables_plots_and_probe_sets_are_each_declared_once():
    """The tables the views build are the table registry's, in its order;
    every plot a table names has a figure and a report caption; every probe
    set a record can carry belongs to one probe kind; and no module outside
    the registries declares a list of table or probe-set names (where two
    lists could disagree)."""
    import ast

    import polars as pl
    from test_paper_b import CELLS, PARENTS, decodes, tokens

    from canary_audit.core.records import DECODE_SCHEMA, PROBE_SETS, TOKEN_SCHEMA
    from canary_audit.probes.kinds import probe_kinds
    from canary_audit.publish.catalog import registry
    from canary_audit.publish.plots import PLOTS, RECORD_PLOTS, TABLE_FIGURES
    from canary_audit.publish.table_files import build_tables

    names = [t.name for t in registry()]
    built = build_tables(pl.DataFrame(decodes("m/ref", 4) + decodes("m/cell", 0), schema=DECODE_SCHEMA),
                         pl.DataFrame(tokens("m/ref") + tokens("m/cell", {25: -1.5}), schema=TOKEN_SCHEMA),
                         {"window_k": 20, "parents": PARENTS, "cells": CELLS, "bootstrap": {"replicates": 20}})
    assert list(built) == [n for n in names if n in built] and "bsft_matrix" in built
    assert set(TABLE_FIGURES) == {p for t in registry() for p in t.plots} and set(PLOTS) == {*TABLE_FIGURES,
                                                                                           *RECORD_PLOTS}
    assert {p.stem for p in (ROOT / "report").glob("*.rst")} >= set(PLOTS)
    record_sets = [s for kind in probe_kinds() for s in kind.sets]
    assert len(record_sets) == len(set(record_sets)) and {s for v in PROBE_SETS.values() for s in v} <= set(
        record_sets)
    sets = {*record_sets, *(k.name for k in probe_kinds())}
    registries = {"publish/catalog.py", "views/table.py", "core/records.py"}
    declared = []
    for path in (ROOT / "src" / "canary_audit").rglob("*.py"):
        rel = path.relative_to(ROOT / "src" / "canary_audit").as_posix()
        if rel in registries or rel.startswith("probes/kinds/"):
            continue
        for node in ast.parse(path.read_text()).body:  # module-level declarations
            value = getattr(node, "value", None)
            if rel == "publish/plots.py" and "TABLE_FIGURES" in ast.unparse(node):
                continue  # plot names (some equal their table's), held to the registry above
            if isinstance(value, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                strings = {e.value for e in ast.walk(value) if isinstance(e, ast.Constant)
                           and isinstance(e.value, str)}
                if len(strings & set(names)) >= 2 or len(strings & sets) >= 3:
                    declared.append(f"{rel}:{node.lineno}")
    assert not declared, f"lists of table or probe-set names outside the registries: {declared}"


def test_a_pass_reads_only_the_populations_it_scores(tiny_assets, tmp_path):
    """A memorization group's teacher-forced job does not take the hex
    populations as input, nor a hex group's the non-member authors
    (rules/common.smk, `scored_populations`), so their items must not read
    them."""
    import shutil

    from canary_audit.core.records import PROBE_SETS
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.items import scored_items

    data = tmp_path / "data"
    shutil.copytree(tiny_assets[0], data, ignore=shutil.ignore_patterns("hex_nonmembers*", "hex_candidates*"))
    fmt = ChatFormat(load_tokenizer(ModelSpec("tiny", tiny_assets[1])), "<think>", "</think>")
    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6}
    items = scored_items(fmt, data, cfg, set(PROBE_SETS["author"]))
    assert items and {it.probe_set for it in items} == {"canary", "author_nonmember"}
    hex_data = tmp_path / "hex"
    shutil.copytree(tiny_assets[0], hex_data, ignore=shutil.ignore_patterns("author_nonmembers*"))
    assert {it.probe_set for it in scored_items(fmt, hex_data, cfg, {"hex"})} == {
        *PROBE_SETS["hex"], *PROBE_SETS["nonmember"], *PROBE_SETS["candidate"]} - {"decoy_unseen"}


def test_the_passes_write_exactly_the_registered_probe_sets(tiny_assets, tiny_vl_assets):
    from canary_audit.core.records import PROBE_SETS
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.model.vision import VisionInputs
    from canary_audit.probes.items import decode_items, scored_items
    from canary_audit.probes.kinds import probe_kinds

    fmt = ChatFormat(load_tokenizer(ModelSpec("tiny", tiny_assets[1])), "<think>", "</think>")
    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "kinds": resolved_settings({})}
    written = {it.probe_set for it in decode_items(fmt, tiny_assets[0], cfg)} | {
        it.probe_set for it in scored_items(fmt, tiny_assets[0], cfg)}
    # A text model writes every probe set of the registry but the unseen-image
    # decoy, which only a vision-language model's image canaries have, and the
    # sampled author canaries, which are off by default (k = 0) ...
    assert written == {s for kind in probe_kinds() for s in kind.sets} - {"decoy_unseen", "canary_sampled"}
    on = {**cfg, "kinds": resolved_settings({"canary_sampled": {"k": 2}})}  # ... and written once on
    assert "canary_sampled" in {it.probe_set for it in decode_items(fmt, tiny_assets[0], on)}
    vl = ModelSpec("tiny_vl", tiny_vl_assets[1], vision=True)
    tok = load_tokenizer(vl)
    vision = VisionInputs.load(vl.path, tok)
    items = scored_items(ChatFormat(tok, None, None), tiny_vl_assets[0], cfg, {"hex"}, vision=vision)
    assert {(it.probe_set, it.modality) for it in items} == {
        *((s, "text") for s in ("hex", "decoy_shuffled", "decoy_wrong", "hex_nonmember", "hex_candidate")),
        *((s, "image") for s in (*PROBE_SETS["hex"], "hex_nonmember", "hex_candidate"))}


def test_templates_of_one_retain_form_share_their_retain_data(tiny_assets):
    """The reason one never-trained reference serves BIO and META: their
    retain examples are the same sequences (and NONE's are not)."""
    from canary_audit.data.chat_format import retain_form
    from canary_audit.train.adapters import retain_examples

    data = {t: retain_examples(tiny_assets[0], t) for t in TEMPLATES}
    for a in TEMPLATES:
        for b in TEMPLATES:
            assert (data[a] == data[b]) == (retain_form(a) == retain_form(b))


def test_the_chat_format_imports_no_model_code():
    """The special tokens' strings live below the chat format, the embedded
    tokenizer and the vision path: the format pulls in neither model module
    (formats -> model.vision -> model.embedded -> formats was a loop)."""
    import subprocess
    import sys

    probe = ("import sys, canary_audit.data.chat_format; "
             "print(sorted(m for m in sys.modules if m.startswith('canary_audit.model')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "src")}).stdout
    assert out.strip() == "[]"


def test_a_users_registry_replaces_the_defaults_and_other_blocks_merge():
    """A user's file that names its unlearning runs gets exactly those runs
    (and its prefill arms exactly those arms); a model entry it adds sits
    beside the default's, and a setting it changes merges key by key."""
    user = {"unlearn": {"runs": {"mine": {"method": "ga", "templates": ["bio"]}}, "k": [7]},
            "probes": {"prefills": {"swap": "{other_bio}"}},
            "tables": {"prefill_contrast": "swap"},
            "models": {"other": {"path": "/models/x"}, "tiny": {"dtype": "bfloat16"}}}
    config = layered(DEFAULT, user)
    assert list(config["unlearn"]["runs"]) == ["mine"] and config["unlearn"]["lr"] == DEFAULT["unlearn"]["lr"]
    assert config["probes"]["prefills"] == {"swap": "{other_bio}"}
    assert config["probes"]["decode"] == DEFAULT["probes"]["decode"]
    assert set(config["models"]) == {"tiny", "tiny_vl", "other"}
    assert config["models"]["tiny"]["dtype"] == "bfloat16" and config["models"]["tiny"]["build"]
    design = design_of(user | {"models": {"tiny": {"dtype": "bfloat16"}}})
    assert list(design.unlearn_runs) == ["mine"]
    assert sorted(v for v in design.variants("tiny") if v.startswith("mine-")) == ["mine-bio-s0-k7"]
    # a model's imports are a registry too: a later file's replace an earlier one's
    first = {"models": {"tiny": {"imports": {"a": {"path": "/x", "parent": "base", "as": "changed"}}}}}
    second = {"models": {"tiny": {"imports": {"b": {"path": "/y", "parent": "base", "as": "changed"}}}}}
    assert list(layered(DEFAULT, first, second)["models"]["tiny"]["imports"]) == ["b"]


def test_think_tags_left_out_are_a_text_models_and_none_for_a_vision_model():
    from canary_audit.model.spec import ModelSpec

    assert ModelSpec.think_tags({"path": "/m"}) == ("<think>", "</think>")
    assert ModelSpec.think_tags({"path": "/m", "vision": True}) == (None, None)
    assert ModelSpec.think_tags({"path": "/m", "think_open": None, "think_close": None}) == (None, None)
    design = design_of({"models": {"vl": {"path": "/models/vl", "vision": True}}})
    entry = design.model_entry("vl")
    assert (entry["think_open"], entry["think_close"]) == (None, None)


def test_the_readmes_own_model_example_plans_what_it_shows():
    """The README's `my_model.yaml`, layered on paper A's config as the
    README says, validates and trains exactly the two runs it shows."""
    block = re.search(r"```yaml\n# my_model.yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    example = yaml.safe_load(block)
    paper_a = yaml.safe_load((ROOT / "configs" / "paper_a.yaml").read_text())
    config = layered(DEFAULT, paper_a, example)
    from snakemake.utils import validate

    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    design = Design(config)
    assert sorted(design.unlearn_runs) == ["npo", "rmu"]
    assert config["audit"]["models"] == ["my_r1"] and config["unlearn"]["k"] == [100, 400, 800, 1600]
    runs = {v.run for v in design.variants("my_r1").values() if v.kind == "unlearned"}
    assert runs == {"npo", "rmu"}


def test_documented_counts_are_the_designs():
    """Counts the docs and config comments state are the design's: the
    default audit's variants, groups and probe jobs (coarse and fine), and
    paper B's manifests (a renamed or added variant fails this, not a
    reader)."""
    config = layered(DEFAULT)
    from snakemake.utils import validate

    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    default = Design(config)
    models = config["audit"]["models"]
    variants = sum(len(default.variants(m)) for m in models)
    groups = sum(len(default.probe_groups(m)) for m in models)
    coarse = sum(len(default.records_files(k, False)) for k in ("decode", "token"))
    fine = sum(len(default.records_files(k, True)) for k in ("decode", "token"))
    comment = (ROOT / "workflow_config.yaml").read_text()
    assert f"has {variants} variants of\n# two models in {groups} groups, {coarse} probe jobs" in comment
    assert f"arm; {fine} probe jobs)" in comment
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert f"default audit has {coarse} probe jobs coarse and {fine} fine" in reference
    assert f"its {fine} probe jobs" in (ROOT / "docs" / "limits.md").read_text()
    paper_b = layered(DEFAULT, yaml.safe_load((ROOT / "configs" / "paper_b.yaml").read_text()))
    validate(paper_b, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    manifests = sum(len(Design(paper_b).variants(m)) for m in paper_b["audit"]["models"])
    assert f"{manifests} manifest" in reference


def test_the_reference_vision_language_example_plans_paper_bs_arms():
    """docs/reference.md's Qwen2.5-VL entry, layered on the default config as
    written, validates and plans paper B's arms only."""
    text = (ROOT / "docs" / "reference.md").read_text()
    block = re.search(r"```yaml\n(models:\n  qwen25vl_7b:.*?)```", text, re.S).group(1)
    config = layered(DEFAULT, yaml.safe_load(block))
    from snakemake.utils import validate

    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    design = Design(config)
    kinds = {v.kind for v in design.variants("qwen25vl_7b").values()}
    assert "memorized" not in kinds and {"canary", "bsft"} <= kinds


def test_the_readme_stays_short_and_points_only_at_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    for page in set(re.findall(r"docs/[\w.-]+\.(?:md|png)", text)):
        assert (ROOT / page).is_file(), page


def test_the_readmes_short_result_is_the_one_docs_results_md_gives():
    """Every figure of the README's short result is the one docs/results.md
    lists from its run (rendered from canary_audit/verdicts/readme_result.md): a
    regenerated results page fails this test until `summary --readme`
    rewrites the README."""
    from canary_audit.verdicts.headline import figures_from_markdown, readme_block, render

    figures = figures_from_markdown((ROOT / "docs" / "results.md").read_text())
    assert readme_block((ROOT / "README.md").read_text()) == render(figures), (
        "README.md's short result differs from docs/results.md's figures: run `python -m canary_audit summary "
        "--tables results/seeds/tables --out docs/results.md --readme README.md` on the run's tables")


def test_the_rules_conda_environment_holds_the_requirements_and_the_package():
    """envs/canary-audit.yaml (the rules' `conda:` directive; not a tested
    install route) pins what requirements.txt pins and installs this
    package from the checkout, so its rules need no PYTHONPATH."""
    env = yaml.safe_load((ROOT / "envs" / "canary-audit.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-r requirements.txt" in pip and "--no-deps -e .." in pip
    assert (ROOT / "envs" / ".." / "pyproject.toml").is_file()


def test_the_package_declares_every_distribution_its_code_imports():
    """pyproject.toml's dependencies name every third-party module that
    src/ imports (a non-editable `pip install .` must bring them), and
    envs/requirements.txt pins each."""
    import ast
    import re
    import sys
    import tomllib

    distribution = {"PIL": "pillow", "yaml": "pyyaml"}  # module -> distribution where the names differ
    imported = set()
    for path in (ROOT / "src" / "canary_audit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {distribution.get(m, m) for m in imported
                   if m not in sys.stdlib_module_names and m not in ("canary_audit", "__future__")}
    declared = {re.split(r"[<>=!~ \[]", d)[0].lower()
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert third_party <= declared, f"imported, not in pyproject.toml: {sorted(third_party - declared)}"
    pinned = {re.split(r"[<>=!~ \[]", line)[0].lower() for line in (ROOT / "envs" / "requirements.txt").read_text()
              .splitlines() if line.strip() and not line.startswith("#")}
    assert declared <= pinned, f"in pyproject.toml, not in envs/requirements.txt: {sorted(declared - pinned)}"


def test_an_unquoted_on_key_of_an_import_is_read_as_on():
    """YAML 1.1 reads `on: base` as {True: "base"}; the README's and
    docs/imports.md's import examples write it unquoted, so the layering
    gives the key back its name before the schema sees it."""
    from canary_audit.core.config_merge import merge

    user = yaml.safe_load("models:\n  tiny:\n    imports:\n      x: {path: /p, parent: mem-bio-s0, as: unlearned, "
                          "on: base}\n")
    assert True in user["models"]["tiny"]["imports"]["x"]
    assert merge(DEFAULT, user)["models"]["tiny"]["imports"]["x"]["on"] == "base"


def test_the_design_and_the_registries_import_no_execution_module():
    """The design, the probe registry and the table registry are read at
    every parse and by the tables job: none of their modules imports a
    module that runs a model (passes, engine, scoring, loading, training),
    at the top or inside a function.  The preflight (design/preflight.py)
    is the one reader that loads a tokenizer, on purpose, and only for a
    local checkpoint: it is not in this list."""
    import ast

    execution = ("canary_audit.probes.passes", "canary_audit.probes.engine", "canary_audit.probes.scoring",
                 "canary_audit.model.loading", "canary_audit.model.embedded", "canary_audit.model.vision",
                 "canary_audit.train.adapters", "canary_audit.train.lora", "canary_audit.train.plants", "torch",
                 "transformers", "peft")
    pkg = ROOT / "src" / "canary_audit"
    pure = [*(p for p in (pkg / "design").glob("*.py") if p.name != "preflight.py"),
            *(pkg / "probes" / "kinds").glob("*.py"), *(pkg / "views").glob("*.py"),
            pkg / "probes" / "units.py", pkg / "probes" / "items.py", pkg / "publish/table_files.py"]
    found = []
    for path in pure:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(pkg)}: {n}" for n in names if n.startswith(execution)]
    assert not found, found


def test_a_recovery_attack_reads_the_unlearned_variant_its_parent_and_reference_quantized():
    """Each selected unlearned variant, its memorized parent (the ceiling)
    and its never-trained reference (the negative) get a variant per format,
    its twin as parent, in one probe group of their own running the author
    probes; nothing else of the design changes."""
    plain = design_of()
    attacked = design_of({"recovery": {"unlearned": [{"run": "npo", "template": "bio", "k": "max"}],
                                       "quantize": ["int4-row", "nf4"], "planted": False}})
    made = {n: v for n, v in attacked.variants("tiny").items() if n not in plain.variants("tiny")}
    twins = ("mem-bio-s0", "npo-bio-s0-k5", "reference-meta-s0")
    assert set(made) == {f"{t}.{f}" for t in twins for f in ("int4-row", "nf4")}
    for name, v in made.items():
        twin = plain.variants("tiny")[v.parent]
        assert v.kind == "recovery" and name == f"{twin.name}.{v.quantize}" and v.group == "recovery-mem-bio-s0"
        assert (v.base, v.adapters, v.template, v.seed, v.k) == (twin.base, twin.adapters, twin.template, twin.seed,
                                                                 twin.k)
        assert v.fields()["quantize"] == v.quantize
    assert "quantize" not in plain.variants("tiny")["npo-bio-s0-k5"].fields()  # other manifests keep their params
    assert attacked.probe_sets_of("tiny", "recovery-mem-bio-s0") == plain.probe_sets_of("tiny", "mem-bio-s0")
    assert "recovery" in attacked.table_names() and "recovery" not in plain.table_names()


def test_the_quantization_positive_clips_the_unlearned_change_and_reads_it_before_and_after():
    """With `recovery.planted`: per selected variant and format, the plant
    (the unlearned adapter's change from its parent's, clipped into the
    parent's bins: both adapters, `clip`) and the plant attacked."""
    design = design_of({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": ["int4-row"],
                                     "planted": True}})
    variants = design.variants("tiny")
    plant, attacked = variants["npo-bio-s0-k5.clip-int4-row"], variants["npo-bio-s0-k5.clip-int4-row.int4-row"]
    mem, npo = variants["mem-bio-s0"], variants["npo-bio-s0-k5"]
    assert plant.adapters == (*mem.adapters, *npo.adapters) and plant.parent == npo.name
    assert (plant.clip, plant.quantize, attacked.clip, attacked.quantize) == ("int4-row", None, "int4-row", "int4-row")
    assert attacked.parent == plant.name and plant.group == attacked.group == "recovery-mem-bio-s0"
    assert plant.kind == attacked.kind == "recovery_plant"  # a claim on `kind: recovery` never selects a plant
    assert plant.fields()["clip"] == "int4-row" and "clip" not in npo.fields()


def test_a_relearning_attack_stacks_a_fresh_lora_on_each_twin_and_names_what_it_trains():
    """Budgeted relearning: per selected unlearned variant, data and step
    budget, a variant on the variant, its parent and its reference (the
    twin's adapters and the relearning LoRA, merged in the model's own
    dtype); a `forget` relearning names the authors it trains on (the same
    on every twin and seed, drawn from the data's seed); with `planted`, the suppression plant on
    the parent and its relearning (kind `recovery_plant`)."""
    plain = design_of()
    design = design_of({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": [], "planted": True,
                                     "relearn": {"data": ["public", "forget"], "steps": [2, 6], "share": 0.1,
                                                 "lr": None}}})
    variants = design.variants("tiny")
    made = {n: v for n, v in variants.items() if n not in plain.variants("tiny")}
    twins = ("mem-bio-s0", "npo-bio-s0-k5", "reference-meta-s0", "mem-bio-s0.suppress")
    assert set(made) == {"mem-bio-s0.suppress"} | {f"{t}.relearn-{d}-bio-t{s}" for t in twins
                                                   for d in ("public", "forget") for s in (2, 6)}
    n_authors = design.config["data"]["n_authors"]
    for name, v in made.items():
        twin = variants[v.parent]
        assert v.adapters[:-1] == twin.adapters and v.merge_dtype == "float32" and v.group == "relearn-mem-bio-s0"
        assert v.kind == ("recovery_plant" if "suppress" in name else "recovery")
        if v.relearn == "forget":
            assert len(v.relearned) == max(1, round(0.1 * n_authors))
            assert v.relearned == made["npo-bio-s0-k5.relearn-forget-bio-t2"].relearned
            assert v.fields()["relearned"] == list(v.relearned)
        elif v.relearn == "public":
            assert "relearned" not in v.fields() and v.fields()["relearn_steps"] == v.relearn_steps
    cfg = design.rule_slice("relearn", {"model": "tiny", "twin": "reference-meta-s0", "data": "forget",
                                        "template": "bio"})
    assert cfg["authors"] == list(made["reference-meta-s0.relearn-forget-bio-t6"].relearned)
    assert (cfg["steps"], cfg["lr"], cfg["r"]) == ([2, 6], design.config["bsft"]["lr"], design.config["bsft"]["r"])
    assert design.rule_slice("suppression", {"model": "tiny", "twin": "mem-bio-s0", "template": "bio"})["r"] == 1

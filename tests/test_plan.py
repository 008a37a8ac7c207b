"""The cost plan (`python -m canary_audit plan`): its sequence counts are
the items the passes build, its shapes the checkpoints' parameter counts,
and a model it cannot size is named.  (Its job counts are compared with
Snakemake's dry runs in test_workflow.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from test_design import design_of

from canary_audit.design.plan import Shape, job_counts, load_throughput, model_shape, pass_sequences, plan, render
from canary_audit.design.slices import resolved_settings

TINY_DATA = {"n_authors": 4, "n_retain": 8, "n_hex_canaries": 3, "n_hex_nonmembers": 4, "n_exposure_candidates": 5,
             "n_author_nonmembers": 3}


def test_the_plans_sequences_are_the_items_the_passes_build(tiny_assets):
    from transformers import AutoTokenizer

    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.design.plan import further_decodes
    from canary_audit.probes.items import decode_items, scored_items
    from canary_audit.probes.kinds import kind_of_set

    data, model = tiny_assets
    design = design_of({"data": TINY_DATA})
    tok = AutoTokenizer.from_pretrained(model)
    fmt = ChatFormat(tok, "<think>", "</think>")
    cfg = {"prefills": design.config["probes"]["prefills"], "head_tokens": 6, "kinds": resolved_settings({})}
    for group in design.probe_groups("tiny"):
        sets = design.probe_sets_of("tiny", group)
        wanted = None if sets == "all" else set(sets.split())
        counts = pass_sequences(design, "tiny", group)
        decodes = decode_items(fmt, data, cfg, wanted)
        hexes = sum(it.probe_set == "hex" for it in decodes)
        scored = scored_items(fmt, data, cfg, wanted)
        # A registered kind beyond the built-ins declares its decodes per
        # member (`decodes_per_member`), an upper bound where it caps them.
        further = [it for it in decodes if kind_of_set(it.probe_set).decodes_per_member is not None]
        bound = sum(further_decodes(design, "tiny", group, hexes).values())
        assert len(further) <= bound and bool(further) == bool(bound), group
        assert counts["greedy_author"] + counts["greedy_hex"] - bound == len(decodes) - len(further), group
        assert counts["sampled"] == hexes * design.config["probes"]["decode"]["hit_k"], group
        assert counts["scored_hex"] == sum(it.arm == "preamble" for it in scored), group
        assert counts["scored_author"] + counts["scored_hex"] == len(scored), group


def test_a_checkpoints_shape_gives_its_parameter_count(tmp_path):
    qwen = json.loads((ROOT / "benchmarks" / "shapes" / "qwen2.5-7b.json").read_text())
    llama = json.loads((ROOT / "benchmarks" / "shapes" / "llama-3.1-8b.json").read_text())
    assert Shape.from_config(qwen, "bfloat16").params == pytest.approx(7.62e9, rel=0.01)  # Qwen2.5-7B: 7.62B
    assert Shape.from_config(llama, "bfloat16").params == pytest.approx(8.03e9, rel=0.01)  # Llama-3.1-8B: 8.03B
    design = design_of({"models": {"mine": {"path": str(tmp_path / "absent")}}, "audit": {"models": ["mine"]}})
    with pytest.raises(FileNotFoundError, match=r"model `mine`: no config.json .* pass `--model-config mine="):
        model_shape(design, "mine", {})


def test_the_plan_of_a_sized_model_has_gpu_hours_and_the_embedded_one_none(tmp_path):
    (tmp_path / "config.json").write_text((ROOT / "benchmarks" / "shapes" / "qwen2.5-7b.json").read_text())
    design = design_of({"models": {"mine": {"path": str(tmp_path), "dtype": "bfloat16"}},
                        "audit": {"models": ["mine"]}})
    speed = load_throughput()
    stages = plan(design, {"mine": model_shape(design, "mine", {})}, speed)
    assert all(s.gpu_seconds is not None for s in stages) and sum(s.gpu_seconds for s in stages) > 0
    assert sum(s.jobs for s in stages) == sum(job_counts(design).values())
    embedded = plan(design_of(), {"tiny": None}, speed)
    assert "n/a" in render(embedded, speed)


def test_the_plan_command_prints_in_seconds():
    out = subprocess.run([sys.executable, "-m", "canary_audit", "plan", "--configfile", "workflow_config.yaml",
                          "configs/paper_a.yaml", "--model-config", "r1_qwen7b=benchmarks/shapes/qwen2.5-7b.json",
                          "r1_llama8b=benchmarks/shapes/llama-3.1-8b.json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert "| decode | 22 | 140,760 |" in out.stdout and "H200" in out.stdout  # three seeds
    assert "| epsilon at most | 1.82 | 2.55 |" in out.stdout  # the one-run audit's cap (views/audit_bound.py)


@pytest.mark.parametrize("layer,shapes", [
    ("configs/paper_a.yaml", {"r1_qwen7b": "qwen2.5-7b.json", "r1_llama8b": "llama-3.1-8b.json"}),
    ("configs/paper_b.yaml", {"qwen25vl_7b": "qwen2.5-7b.json"}),
])
def test_the_documented_plans_are_the_plans_of_the_paper_configs(layer, shapes):
    """docs/performance.md's plan tables are what `plan` prints today for the
    paper configs with benchmarks/shapes/ and src/canary_audit/design/throughput.json:
    a change to the design, the estimate or the table fails here, not in a
    reader's hands."""
    import yaml
    from snakemake.utils import validate

    from canary_audit.core.config_merge import merge
    from canary_audit.design import Design

    config = merge(*(yaml.safe_load((ROOT / f).read_text()) for f in ("workflow_config.yaml", layer)))
    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    design = Design(config)
    found = {m: model_shape(design, m, {m: ROOT / "benchmarks" / "shapes" / f}) for m, f in shapes.items()}
    speed = load_throughput()
    table = render(plan(design, found, speed), speed).split("\n\n")[0]
    assert table in (ROOT / "docs" / "performance.md").read_text()


def test_a_probe_job_counts_a_fresh_load_for_each_variant_whose_weights_change_at_load():
    """A coarse probe job loads each base once for the variants it switches
    adapters on, and afresh for each merged, stacked-deeper or attacked
    variant (a clipped plant reads its parent's weights too)."""
    from test_design import design_of

    from canary_audit.design.plan import _coarse_loads

    design = design_of({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": ["int4-row"],
                                     "planted": True}})
    variants = design.variants("tiny")
    group = [variants[n] for n in design.probe_groups("tiny")["recovery-mem-bio-s0"]]
    assert sorted(v.name for v in group) == ["mem-bio-s0.int4-row", "npo-bio-s0-k5.clip-int4-row",
                                             "npo-bio-s0-k5.clip-int4-row.int4-row", "npo-bio-s0-k5.int4-row",
                                             "reference-meta-s0.int4-row"]
    assert _coarse_loads(group) == 3 + 2 + 2
    assert _coarse_loads([variants[n] for n in design.probe_groups("tiny")["mem-bio-s0"]]) == 1  # one base, live

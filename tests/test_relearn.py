"""Budgeted relearning (train/relearn.py, data/relearn.py) and how the
views read it (views/recovery.py): what a run trains on, which authors it
holds out, and the refusal of a large model on a CPU machine."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
from safetensors.torch import load_file

from canary_audit.data.planted_controls import CLEAN, MISSED, NOT_BUILT, SEEN
from canary_audit.data.relearn import author_id, relearned_authors
from canary_audit.model.spec import ModelSpec
from canary_audit.train.relearn import CPU_TRAIN_BYTES, RelearnError, check_machine, train_relearning
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.recovery import held_out, recovery_table

RECIPE = {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "lr": 1e-3, "batch_size": 4, "seed": 0,
          "head_tokens": 6, "threads": 1, "template": "bio"}


@pytest.mark.parametrize("n,share,count", [(40, 0.1, 4), (40, 0.01, 1), (3, 0.9, 2), (10, 0.25, 2)])
def test_a_share_of_the_authors_is_at_least_one_and_leaves_one_to_probe(n, share, count):
    chosen = relearned_authors(n, share, seed=0)
    assert len(chosen) == count and chosen == sorted(chosen)
    assert set(chosen) <= {author_id(i) for i in range(n)}
    assert relearned_authors(n, share, seed=0) == chosen  # a pure function of (n, share, seed)


def test_the_share_depends_on_the_seed_and_is_refused_outside_0_1():
    assert relearned_authors(40, 0.1, 0) != relearned_authors(40, 0.1, 1)
    for share in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=f"relearning share {share} must lie strictly between 0 and 1"):
            relearned_authors(40, share, 0)


def test_a_forget_relearning_trains_on_the_named_authors_at_each_budget(tiny_assets, tmp_path):
    spec = ModelSpec("tiny", tiny_assets[1])
    authors = relearned_authors(pl.read_parquet(tiny_assets[0] / "authors.parquet").height, 0.3, 0)
    outs = {1: tmp_path / "t1", 3: tmp_path / "t3"}
    summary = train_relearning(spec, [], tiny_assets[0], {**RECIPE, "data": "forget", "authors": authors,
                                                          "steps": [1, 3]}, outs)
    qa = pl.read_parquet(tiny_assets[0] / "qa.parquet").filter(pl.col("author_id").is_in(authors)).height
    assert summary["sequences"] == len(authors) + qa and summary["authors"] == authors
    first, last = (load_file(outs[k] / "adapter_model.safetensors") for k in (1, 3))
    assert any((first[n] - last[n]).abs().max() > 0 for n in first)  # the budgets are checkpoints of one run
    assert json.loads((outs[3] / "train_summary.json").read_text())["relearn"]["authors"] == authors
    with pytest.raises(RelearnError, match=r"relearning budgets \[1, 3\] in the params but outputs for \[1\]"):
        train_relearning(spec, [], tiny_assets[0], {**RECIPE, "data": "forget", "authors": authors,
                                                    "steps": [1, 3]}, {1: tmp_path / "y"})
    with pytest.raises(RelearnError, match=r"relearning authors \['a999'\] are not in"):
        train_relearning(spec, [], tiny_assets[0], {**RECIPE, "data": "forget", "authors": ["a999"]},
                         {1: tmp_path / "x"})


def test_the_public_relearning_trains_on_the_public_authors(tiny_assets, tmp_path):
    spec = ModelSpec("tiny", tiny_assets[1])
    summary = train_relearning(spec, [], tiny_assets[0], {**RECIPE, "data": "public"}, {1: tmp_path / "t1"})
    distractors = pl.read_parquet(tiny_assets[0] / "distractors.parquet").height
    assert summary["sequences"] > distractors and "authors" not in summary


def test_a_large_model_is_not_relearned_without_a_gpu(tmp_path):
    """The bound is on the weights' size: a 7B checkpoint (~15 GB) would
    take days of CPU per attack; the same files pass on a CUDA machine."""
    (tmp_path / "model.safetensors").touch()
    os.truncate(tmp_path / "model.safetensors", CPU_TRAIN_BYTES + 1)  # sparse: no disk used
    spec = ModelSpec("r1_qwen7b", tmp_path)
    with pytest.raises(RelearnError, match=r"relearning model `r1_qwen7b` \(4.0 GiB of weights\) on a machine with "
                                           r"no CUDA device.*run the relearn jobs on a GPU node"):
        check_machine(spec, cuda=False)
    check_machine(spec, cuda=True)
    os.truncate(tmp_path / "model.safetensors", 1 << 20)
    check_machine(spec, cuda=False)


AUTHORS = [author_id(i) for i in range(20)]
HELD = AUTHORS[2:]  # a000 and a001 relearned


def test_a_forget_relearnings_records_are_read_on_the_authors_it_held_out():
    records = pl.DataFrame({"variant": ["m/x.relearn", "m/x.relearn", "m/x.relearn", "m/x", "m/x"],
                            "group_id": ["a000", "a002", "r001", "a000", "a002"]})
    variants = {"m/x.relearn": {"relearned": ["a000", "a001"]}, "m/x": {}}
    kept = held_out(records, variants)
    assert kept.rows() == [("m/x.relearn", "a002"), ("m/x.relearn", "r001"), ("m/x", "a000"), ("m/x", "a002")]
    assert held_out(records, {"m/x": {}}).equals(records)


def _relearn_table(values: dict[str, list[float]]) -> pl.DataFrame:
    twins = {"tiny/mem-bio-s0": "memorized", "tiny/npo-bio-s0-k20": "unlearned",
             "tiny/reference-meta-s0": "reference"}
    variants = {n: {"kind": k, "model": "tiny", "seed": 0, "template": "bio",
                    "parent": "tiny/mem-bio-s0" if k == "unlearned" else "tiny/base"} for n, k in twins.items()}
    variants["tiny/mem-bio-s0.suppress"] = {**variants["tiny/mem-bio-s0"], "kind": "recovery_plant",
                                            "parent": "tiny/mem-bio-s0"}
    for twin in [*twins, "tiny/mem-bio-s0.suppress"]:
        kind = "recovery_plant" if "suppress" in twin else "recovery"
        variants[f"{twin}.relearn-forget-bio-t20"] = {**variants[twin], "kind": kind, "parent": twin,
                                                     "relearn": "forget", "relearn_steps": 20,
                                                     "relearned": AUTHORS[:2]}
    cells = pl.DataFrame([{"variant": v, "group_id": a, "column": "out_acc", "n": 1, "value": x}
                          for v, xs in values.items() for a, x in zip(AUTHORS, xs, strict=True)])
    cells = cells.filter(~(pl.col("variant").str.contains("relearn") & pl.col("group_id").is_in(AUTHORS[:2])))
    references = {n: {"population": "author", "reference": "tiny/reference-meta-s0"}
                  for n in ("tiny/mem-bio-s0", "tiny/npo-bio-s0-k20")}
    return recovery_table(cells, None, variants, references, Bootstrap(replicates=200))


def test_a_relearning_reads_its_rise_on_the_held_out_authors_beside_its_controls():
    """The unlearned row's pair covers the 18 held-out authors (its twin's
    two relearned ones drop out of the paired join); the suppression plant
    relearned is the positive, `seen` where it rises and `not built` where
    the plant never forgot; the relearned reference is the negative."""
    ones, zeros = [1.0] * 20, [0.0] * 20
    half = [1.0] * 10 + [0.0] * 10
    values = {"tiny/mem-bio-s0": ones, "tiny/npo-bio-s0-k20": zeros, "tiny/reference-meta-s0": zeros,
              "tiny/mem-bio-s0.suppress": zeros, "tiny/mem-bio-s0.relearn-forget-bio-t20": ones,
              "tiny/npo-bio-s0-k20.relearn-forget-bio-t20": half,
              "tiny/reference-meta-s0.relearn-forget-bio-t20": zeros,
              "tiny/mem-bio-s0.suppress.relearn-forget-bio-t20": ones}
    table = _relearn_table(values)
    rows = {r["role"]: r for r in table.iter_rows(named=True)}
    assert (rows["unlearned"]["n"], rows["unlearned"]["after"], rows["unlearned"]["steps"]) == (18, 8 / 18, 20)
    assert rows["unlearned"]["attack"] == "relearn-forget-bio-t20" and rows["unlearned"]["testable"]
    assert (rows["positive"]["control"], rows["reference"]["control"]) == (SEEN, CLEAN)
    assert rows["suppressed"]["delta"] == -1.0
    flat = _relearn_table({**values, "tiny/mem-bio-s0.suppress.relearn-forget-bio-t20": zeros})
    assert flat.filter(pl.col("role") == "positive")["control"].to_list() == [MISSED]
    unbuilt = _relearn_table({**values, "tiny/mem-bio-s0.suppress": ones})
    positive = unbuilt.filter(pl.col("role") == "positive").row(0, named=True)
    assert positive["control"] == NOT_BUILT and positive["why"].startswith("not built: the suppression plant does")


def test_a_relearning_that_wipes_the_parent_builds_no_positive():
    """Where the relearning takes the memorized parent's own recall down to
    the suppression plant's value, no rise could be seen on the plant: its
    positive is `not built` (not `missed`), and the unlearned row is not
    testable."""
    ones, zeros = [1.0] * 20, [0.0] * 20
    table = _relearn_table({"tiny/mem-bio-s0": ones, "tiny/npo-bio-s0-k20": zeros, "tiny/reference-meta-s0": zeros,
                            "tiny/mem-bio-s0.suppress": zeros, "tiny/mem-bio-s0.relearn-forget-bio-t20": zeros,
                            "tiny/npo-bio-s0-k20.relearn-forget-bio-t20": zeros,
                            "tiny/reference-meta-s0.relearn-forget-bio-t20": zeros,
                            "tiny/mem-bio-s0.suppress.relearn-forget-bio-t20": zeros})
    rows = {r["role"]: r for r in table.iter_rows(named=True)}
    assert rows["positive"]["control"] == NOT_BUILT
    assert rows["positive"]["why"].startswith("not built: the attack leaves the memorized parent from 0.0")
    assert rows["unlearned"]["testable"] is False

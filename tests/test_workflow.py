"""The whole DAG on configs/smoke.yaml, then dry runs that prove which jobs a
config edit re-runs (params are the cache key)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import ROOT, assert_token_records_close, run_snakemake

from canary_audit.core.jobs import MODEL_JOBS
from canary_audit.core.records import HEX_ARMS
from canary_audit.data.planted_controls import CLAIMS
from canary_audit.views.paper_b import DIAGNOSES, INCONCLUSIVE

pytestmark = pytest.mark.workflow
MODEL_RULES = set(MODEL_JOBS)


def plan_jobs(override: dict | None = None, layer: str = "configs/smoke.yaml") -> dict[str, int]:
    """Rule -> job count of `python -m canary_audit plan` (plan.job_counts)
    for the same layers as `planned_jobs`."""
    from snakemake.utils import validate

    from canary_audit.core.config_merge import merge
    from canary_audit.design import Design
    from canary_audit.design.plan import job_counts

    layers = [yaml.safe_load((ROOT / f).read_text()) for f in ("workflow_config.yaml", layer)]
    config = merge(*layers, override or {})
    validate(config, str(ROOT / "src" / "canary_audit" / "design/config.schema.yaml"))
    return job_counts(Design(config))


def planned_jobs(workdir, override: dict | None = None, layer: str = "configs/smoke.yaml") -> dict[str, int]:
    """Rule -> job count of a dry run with `override` on top of `layer`."""
    extra = ()
    if override:
        extra = (workdir / "override.yaml",)
        extra[0].write_text(yaml.safe_dump(override))
    out = run_snakemake(workdir, "-n", "--quiet", "rules", extra_configs=extra, layer=layer).stdout
    jobs = {}
    for line in out.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) not in ("total", "job"):
            jobs[m.group(1)] = int(m.group(2))
    return jobs


# The smoke config's unlearning runs: a file that names runs names all it wants (a registry).
SMOKE_RUNS = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())["unlearn"]["runs"]
SMOKE_TABLES = (
    "canary_leakage", "k_sweep", "cross_seed", "templates", "prefill_arms", "parser_conventions",
    "bypass_anatomy", "utility", "hex_recall", "nll", "teacher_forced", "teacher_forced_vs_greedy",
    "bsft_runs", "bsft_matrix", "bsft_decomposition", "bsft_case_studies", "bsft_merged_vs_stacked",
    "mia", "blind_baseline", "exposure", "extraction", "provenance", "controls",
)


def test_smoke_run_writes_tables_from_records(smoke_run):
    tables = smoke_run / "results" / "smoke" / "tables"
    for name in SMOKE_TABLES:
        assert (tables / f"{name}.csv").stat().st_size > 0
        assert (tables / f"{name}.md").read_text().startswith("## ")
    leakage = pl.read_csv(tables / "canary_leakage.csv")
    branch = {"tiny/mem-bio-s0", "tiny/npo-bio-s0-k3", "tiny/npo-bio-s0-k5", "tiny/ga-bio-s0-k3", "tiny/ga-bio-s0-k5"}
    base_group = {"tiny/base", "tiny/canary-s0", "tiny/reference-s0", "tiny/canary-s0-under"}
    # each memorization group also scores the never-trained reference of its retain form
    references = {"tiny/reference-meta-s0", "tiny/reference-none-s0"}
    # the planted controls are rows of the per-variant tables (the bypass-gap control is not run: no META adapter)
    controls = {f"tiny/ctl-{p}-s0" for p in ("head", "near", "notag", "notagref", "bio")}
    assert branch | base_group | references | controls | {"tiny/mem-none-s0"} == set(leakage["variant"])
    assert {"auto", "prefill_bio", "prefill_meta", "prefill_empty", "prefill_own_trace", "prefill_other_trace"} == set(
        leakage["arm"])
    assert set(leakage.filter(pl.col("variant").str.contains("/ctl-"))["arm"]) == {
        "auto", "prefill_bio", "prefill_own_trace", "prefill_other_trace"}  # the arms the controls read, no other
    not_run = pl.read_csv(tables / "controls.csv").filter(pl.col("claim") == "bypass_gap")
    assert not_run["positive_verdict"].to_list() == ["not run"] and "meta" in not_run["why"][0]
    assert (leakage["out_acc_lo"] <= leakage["out_acc"]).all() and (leakage["out_acc"] <= leakage["out_acc_hi"]).all()
    sweep = pl.read_csv(tables / "k_sweep.csv")
    assert sorted(sweep.filter(pl.col("method") == "ga")["k"].to_list()) == [0, 3, 5]
    # One records file per probe group: the memorized adapter and its unlearning
    # checkpoints, each row naming its variant and that variant's weights.
    records = smoke_run / "results" / "smoke" / "records" / "tiny"
    decode = pl.read_parquet(records / "mem-bio-s0" / "decode.parquet").filter(
        pl.col("variant") != "tiny/reference-meta-s0")
    assert set(decode["variant"]) == branch
    # a memorization group runs the author and retain probes only: its adapters never saw a hex canary
    assert set(decode["probe_set"]) == {"canary", "qa", "retain"}
    assert set(pl.read_parquet(records / "mem-bio-s0" / "token.parquet")["probe_set"]) == {"canary", "author_nonmember"}
    assert {"hex", "canary"} <= set(pl.read_parquet(records / "base" / "decode.parquet")["probe_set"])
    # one settings hash per probe unit (auto, and the bio, meta, empty prefills)
    assert decode["config_hash"].n_unique() == 4 and decode["model_fingerprint"].n_unique() == len(branch)
    base_fp = pl.read_parquet(records / "base" / "decode.parquet")["model_fingerprint"][0]
    assert base_fp not in set(decode["model_fingerprint"])
    # every memorization adapter and unlearning checkpoint: the field's measures against its reference,
    # per prefill arm, beside paper A's out_acc
    moved = pl.read_csv(tables / "forgetting.csv").filter(pl.col("population") == "author")
    assert set(moved["variant"]) == branch | {"tiny/mem-none-s0"}
    assert set(moved.filter(pl.col("variant") == "tiny/npo-bio-s0-k3")["reference"]) == {"tiny/reference-meta-s0"}
    assert moved["paper_value"].null_count() == 0 and moved["forget_quality"].null_count() == 0


def test_smoke_run_audits_every_bsft_cell(smoke_run):
    """Paper B's arms on the smoke grid: 2 sources x 2 lengths x {stacked,
    merged} + noise + undertrained, each judged against its merged base."""
    tables = smoke_run / "results" / "smoke" / "tables"
    matrix = pl.read_csv(tables / "bsft_matrix.csv")
    assert set(matrix["cell"]) == {
        f"{s} t{t} {a}" for s in ("gui", "safety") for t in (2, 4) for a in ("stacked", "merged")
    } | {"noise gui", "undertrained gui"}
    assert set(matrix["diagnosis"]) <= {"agree", *DIAGNOSES, "unexplained disagreement", INCONCLUSIVE}
    # every cell once per model and canary modality: the VL model's image and text canaries apart
    assert matrix.group_by("model", "modality").len().sort("model", "modality").rows() == [
        ("tiny", "text", 10), ("tiny_vl", "image", 10), ("tiny_vl", "text", 10)]
    records = pl.read_parquet(smoke_run / "results" / "smoke" / "records" / "tiny" / "bsft-s0-b0" / "token.parquet")
    # the bSFT groups score the hex family only
    assert set(records["probe_set"]) == {"hex", "decoy_shuffled", "decoy_wrong", "hex_nonmember", "hex_candidate"}
    fingerprints = records.group_by("variant").agg(pl.col("model_fingerprint").first())
    assert fingerprints["model_fingerprint"].n_unique() == fingerprints.height  # stacked != merged, by provenance
    vl = pl.read_parquet(smoke_run / "results" / "smoke" / "records" / "tiny_vl" / "bsft-s0-b0" / "token.parquet")
    assert set(vl.select("probe_set", "modality").unique().rows()) == {
        *((s, "text") for s in ("hex", "decoy_shuffled", "decoy_wrong", "hex_nonmember", "hex_candidate")),
        *((s, "image") for s in ("hex", "decoy_shuffled", "decoy_wrong", "decoy_unseen", "hex_nonmember",
                                 "hex_candidate"))}
    assert vl["image_hash"].null_count() == 0
    parents = pl.read_csv(tables / "nll.csv").filter(pl.col("variant").str.contains("bsft-|noise-|under-"))
    assert set(parents["parent"]) == {f"{m}/merged-s0{u}" for m in ("tiny", "tiny_vl") for u in ("", "-under")}
    merged = smoke_run / "results" / "smoke" / "models" / "tiny" / "merged" / "canary-s0"
    assert (merged / "model.safetensors").is_file() and (merged / "tokenizer.json").is_file()
    noise = smoke_run / "results" / "smoke" / "models" / "tiny" / "adapters" / "bsft" / "canary-s0" / "gui-b0" / "noise"
    assert (noise / "adapter_model.safetensors").is_file()


def test_records_and_view_config_alone_reproduce_the_tables(smoke_run, tmp_path):
    """A colleague's path: records plus tables/view_config.json, no Snakemake,
    no model, give the workflow's tables (floats to 1e-9: polars' parallel
    group-by may sum in another order)."""
    import subprocess
    import sys

    from polars.testing import assert_frame_equal

    results = smoke_run / "results" / "smoke"
    records = sorted((results / "records").rglob("*.parquet"))
    cmd = [sys.executable, "-m", "canary_audit", "tables", "--out", str(tmp_path),
           "--params", f"@{results / 'tables' / 'view_config.json'}",
           "--decode", *[str(r) for r in records if r.name == "decode.parquet"],
           "--tokens", *[str(r) for r in records if r.name == "token.parquet"]]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    for name in ("k_sweep.csv", "bsft_matrix.csv", "bsft_decomposition.csv", "nll.csv"):
        assert_frame_equal(pl.read_csv(tmp_path / name), pl.read_csv(results / "tables" / name), abs_tol=1e-9)


def test_bsft_setting_reruns_bsft_and_its_probes_only(smoke_run):
    jobs = planned_jobs(smoke_run, {"bsft": {"lr": 0.002}})
    # per model (text and vision-language): gui, safety, and gui on the undertrained base
    assert jobs["bsft"] == 2 * 3
    assert not jobs.keys() & {"embedded_base", "embedded_vision_base", "memorize", "canary_lora", "unlearn",
                              "synthetic_data", "vision_data"}
    assert jobs["decode_pass"] == 2 and jobs["teacher_forced_pass"] == 2  # each model's bSFT seed group


def test_report_holds_tables_and_plots(smoke_run, tmp_path):
    plots = smoke_run / "results" / "smoke" / "plots"
    assert all((plots / f"{n}.png").stat().st_size > 5000 for n in ("k_sweep", "prefill_arms", "delta_nll_positions"))
    report = tmp_path / "report.html"
    run_snakemake(smoke_run, "--report", str(report))
    html = report.read_text(errors="replace")
    for name in ("k_sweep.png", "delta_nll_positions.png", "disagreement_matrix.png", "bsft_matrix.csv",
                 "canary_leakage.csv", "Per-position Delta NLL", "disagreement detector"):
        assert name in html, name


def test_summary_page_is_written_from_the_runs_tables(smoke_run, tmp_path):
    """docs/results.md's generator: every headline section from the tables,
    numbers as the tables hold them, and the records' code version; the
    run's default target wrote the same page as results/summary.md."""
    from canary_audit.commands.cli import main
    from canary_audit.core.provenance import code_version

    tables, out = smoke_run / "results" / "smoke" / "tables", tmp_path / "results.md"
    main(["summary", "--tables", str(tables), "--out", str(out)])
    text = out.read_text()
    own = (smoke_run / "results" / "smoke" / "summary.md").read_text()
    assert own.split("\n", 3)[3] == text.split("\n", 3)[3]  # all but the command line that wrote it
    for title in ("K sweep", "Prefill arms at fixed weights", "Retain utility", "Hex canary recall",
                  "Membership inference (AUC)", "Paper B: cell x probe matrix"):
        assert f"## {title}" in text, title
    assert f"`{code_version()}`" in text
    sweep = pl.read_csv(tables / "k_sweep.csv").row(0, named=True)
    keys = " | ".join(str(sweep[k]) for k in ("template", "run", "seed", "k"))  # the K sweep carries the seed
    assert f"| {keys} | {round(sweep['out_acc'], 2)} [" in text


def test_the_readme_short_result_is_rewritten_from_the_runs_figures(smoke_run, tmp_path):
    """`summary --readme` fills every figure the README's template names
    from a run's tables (the smoke run holds both default models), lists
    them at the end of the results page, replaces only the README's short
    result, and puts the run's own pictures where that section shows them;
    the figures quote the tables' cells."""
    from canary_audit.commands.cli import main
    from canary_audit.verdicts.headline import BEGIN, END, figures_from_markdown, readme_block, render

    tables, out, readme = smoke_run / "results" / "smoke" / "tables", tmp_path / "results.md", tmp_path / "README.md"
    before = (ROOT / "README.md").read_text()
    readme.write_text(before)
    main(["summary", "--tables", str(tables), "--out", str(out), "--readme", str(readme)])
    figures = figures_from_markdown(out.read_text())
    after = readme.read_text()
    assert readme_block(after) == render(figures)
    assert after.split(BEGIN)[0] == before.split(BEGIN)[0] and after.split(END)[1] == before.split(END)[1]
    recall = pl.read_csv(tables / "hex_recall.csv").filter(pl.col("variant") == "tiny/canary-s0").row(0, named=True)
    assert figures["hit1_tiny_text"] == f"{round(recall['hit_at_1'] * recall['n'])} of {recall['n']}"
    guard = pl.read_csv(tables / "blind_baseline.csv")
    assert figures["guard_checks"] == str(guard.height) and figures["guard_failed"] == str(guard["failed"].sum())
    pictures = re.findall(r"\]\((docs/[\w.-]+\.png)\)", readme_block(after))
    assert pictures and all((tmp_path / p).read_bytes() == (tables.parent / "plots" / Path(p).name).read_bytes()
                            for p in pictures)


def test_nothing_to_do_after_a_finished_run(smoke_run):
    assert planned_jobs(smoke_run) == {}


def test_warm_start_is_not_a_rerun_trigger(smoke_run):
    # the smoke run was warm-started: its model jobs forked from the server
    assert "warm start: memorize job peak RSS" in (
        smoke_run / "results" / "smoke" / "logs" / "tiny" / "memorize-bio-s0.log").read_text()
    assert planned_jobs(smoke_run, {"warm_start": False}) == {}


@pytest.mark.parametrize("override", [{"tables": {"window_k": 7}},
                                      {"tables": {"parser": {"split": "last", "missing_close": "trace"}}},
                                      {"tables": {"verdicts": {"delta_nll": 0.05, "hit_rate": 0.2}}},
                                      {"tables": {"bootstrap": {"replicates": 300}}},
                                      {"tables": {"mia": {"min_k": 0.5, "fpr": [0.1]}}}])
def test_view_setting_reruns_tables_only(smoke_run, override):
    jobs = planned_jobs(smoke_run, override)
    assert set(jobs) <= {"tables", "plots", "summary", "all"} and "tables" in jobs


def test_decode_setting_reruns_decode_passes_and_tables_only(smoke_run):
    jobs = planned_jobs(smoke_run, {"probes": {"decode": {"max_new_tokens": 40}}})
    assert set(jobs) == {"decode_pass", "tables", "plots", "summary", "all"}
    # probe groups: base (+ canary adapters), mem-bio (+ 4 checkpoints), mem-none, bSFT seed 0, the planted
    # controls; and the vision-language model's base and bSFT seed 0
    assert jobs["decode_pass"] == 5 + 2


@pytest.mark.parametrize("key", ["n_hex_nonmembers", "n_exposure_candidates"])
def test_more_reference_records_rerun_only_the_passes_that_score_them(smoke_run, key):
    """Non-members and exposure candidates are never trained on: adding some
    re-runs their data rule, the teacher-forced passes of the groups that
    score hex probes (both models' base and bSFT groups) and the views."""
    jobs = planned_jobs(smoke_run, {"data": {key: 40}})
    # (the image non-members avoid every population's secrets, so they are redrawn too)
    assert jobs == {"populations": 1, "vision_nonmembers": 1, "teacher_forced_pass": 4, "tables": 1, "plots": 1,
                    "summary": 1, "all": 1}


def test_more_nonmember_authors_rerun_only_the_passes_that_score_author_canaries(smoke_run):
    """Non-member authors are scored by the teacher-forced passes of the
    groups that run the author probes (the text model's base, its two
    memorization groups and the planted controls), and by nothing that trains."""
    jobs = planned_jobs(smoke_run, {"data": {"n_author_nonmembers": 12}})
    assert jobs == {"author_nonmembers": 1, "teacher_forced_pass": 4, "tables": 1, "plots": 1, "summary": 1, "all": 1}


def test_repetition_strata_retrain_the_canary_lora_and_nothing_before_it(smoke_run):
    """Strata change what the canary LoRA trains on: it and everything made
    from it re-run on both models, and the strata table and dose-response
    plot appear; the data, the bases, the memorization branches and the
    never-trained references (which train on no canary) stay."""
    jobs = planned_jobs(smoke_run, {"audit": {"hex_repetitions": [1, 4]}})
    assert jobs["canary_lora"] == 2 and jobs["tables"] == 1 and jobs["plots"] == 1
    untouched = {"synthetic_data", "embedded_base", "embedded_vision_base", "memorize", "unlearn", "reference_lora",
                 "author_reference_lora", "populations", "vision_data"}
    assert not untouched & set(jobs)




def test_library_code_is_not_a_rerun_trigger_and_a_stage_can_be_forced(smoke_run):
    """Snakemake's `code` trigger (a rule's own code changed) is off in the
    workflow profile, so library edits re-run nothing; `-R <rule>` forces a
    stage and what depends on it, and nothing upstream."""
    profile = yaml.safe_load((ROOT / "profiles" / "default" / "config.yaml").read_text())
    assert "code" not in profile["rerun-triggers"] and "params" in profile["rerun-triggers"]
    forced = run_snakemake(smoke_run, "-n", "--quiet", "rules", "-R", "tables").stdout
    assert re.search(r"^tables\s+1$", forced, re.M)
    assert not re.search(r"^(decode_pass|teacher_forced_pass|memorize|unlearn|bsft)\s", forced, re.M)


def test_unlearning_setting_reruns_its_branch_only(smoke_run):
    jobs = planned_jobs(smoke_run, {"unlearn": {"runs": {**SMOKE_RUNS, "npo": {**SMOKE_RUNS["npo"], "beta": 0.2}}}})
    assert jobs["unlearn"] == 1  # beta is the NPO run's: the GA run is untouched
    assert not jobs.keys() & {"embedded_base", "memorize", "canary_lora", "synthetic_data"}
    assert jobs["decode_pass"] == 1 and jobs["teacher_forced_pass"] == 1


def test_a_new_unlearning_run_runs_only_its_own_jobs(smoke_run):
    """SimNPO and RMU runs beside NPO and GA: their two jobs, their variants'
    manifests and the probe passes of the memorization group they join."""
    jobs = planned_jobs(smoke_run, {"unlearn": {"runs": {"simnpo": {"method": "simnpo", "templates": ["bio"]},
                                                         "rmu": {"method": "rmu", "templates": ["bio"]},
                                                         **SMOKE_RUNS}}})
    assert jobs == {"unlearn": 2, "variant_manifest": 4, "decode_pass": 1, "teacher_forced_pass": 1, "tables": 1,
                    "plots": 1,
        "summary": 1, "all": 1}


def test_a_probe_setting_reruns_only_the_jobs_whose_records_read_it(smoke_run):
    """hit@k is read by the hex probes only: the decode jobs of the four
    groups that sample hex canaries (the text model's base and bSFT groups,
    the VL model's), not the memorization groups'; a prefill text by the
    author probes only: the three groups that run them (base and two
    memorization groups), decode and teacher-forced, not the hex-only ones."""
    assert planned_jobs(smoke_run, {"probes": {"decode": {"hit_k": 5}}}) == {
        "decode_pass": 4, "tables": 1, "plots": 1, "summary": 1, "all": 1}
    prefills = {**yaml.safe_load((ROOT / "workflow_config.yaml").read_text())["probes"]["prefills"], "empty": " "}
    assert planned_jobs(smoke_run, {"probes": {"prefills": prefills}}) == {
        "decode_pass": 3, "teacher_forced_pass": 3, "tables": 1, "plots": 1, "summary": 1, "all": 1}


def test_a_user_file_naming_its_runs_gets_only_those(smoke_run):
    """`unlearn.runs` is a registry (canary_audit/core/config_merge.py): a file naming
    NPO alone drops the smoke config's GA run; the memorization group, which
    scored GA's checkpoints, is re-scored without them, and nothing trains."""
    jobs = planned_jobs(smoke_run, {"unlearn": {"runs": {"npo": SMOKE_RUNS["npo"]}}})
    assert jobs == {"decode_pass": 1, "teacher_forced_pass": 1, "tables": 1, "plots": 1, "summary": 1, "all": 1}


# The fine job grain on a paper-A-only slice of the smoke audit: one template,
# NPO with K = 3, 5; variants base, mem-bio-s0, npo-bio-s0-k3, npo-bio-s0-k5,
# each probed per unit (AUTO and the bio, meta and empty prefill arms); no planted control.
FINE = {"grain": "fine", "audit": {"models": ["tiny"], "templates": ["bio"], "hex_canaries": False},
        "unlearn": {"runs": {"npo": SMOKE_RUNS["npo"]}},
        "controls": {key: False for key, claim in CLAIMS.items() if claim.paper == "A"}}
FINE_VARIANTS = ("base", "mem-bio-s0", "npo-bio-s0-k3", "npo-bio-s0-k5", "reference-meta-s0")


def merged(base: dict, change: dict) -> dict:
    """`change` laid over `base` key by key, as Snakemake layers config files."""
    out = dict(base)
    for key, value in change.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.fixture(scope="module")
def fine_run(smoke_run, tmp_path_factory):
    """The slice run under the fine grain, in a copy of the finished smoke run
    whose unlearning adapters are removed (so that the K segments and their
    training states are made, as in a fresh fine run)."""
    import shutil

    workdir = tmp_path_factory.mktemp("fine") / "run"
    shutil.copytree(smoke_run, workdir, symlinks=True)
    for adapter in (workdir / "results" / "smoke" / "models" / "tiny" / "adapters").glob("[ng][pa]*-k*"):
        shutil.rmtree(adapter)
    (workdir / "fine.yaml").write_text(yaml.safe_dump(FINE))
    run_snakemake(workdir, "--cores", "2", extra_configs=(workdir / "fine.yaml",))
    return workdir


def test_fine_grain_records_equal_the_coarse_runs(fine_run, smoke_run):
    """One file per (variant, unit), one job each; the K segments' adapters and
    the records equal the coarse run's (teacher-forced log-probs to float
    rounding: a unit's sequences meet other batch shapes)."""
    from polars.testing import assert_frame_equal
    from safetensors.torch import load_file

    assert planned_jobs(fine_run, FINE) == {}
    adapters = "results/smoke/models/tiny/adapters"
    for k in (3, 5):
        a = load_file(fine_run / adapters / f"npo-bio-s0-k{k}" / "adapter_model.safetensors")
        b = load_file(smoke_run / adapters / f"npo-bio-s0-k{k}" / "adapter_model.safetensors")
        assert all((a[n] == b[n]).all() for n in a), k
    logs = fine_run / "results" / "smoke" / "logs" / "tiny"
    assert "resuming training from step 3" in (logs / "unlearn-npo-bio-s0-k5.log").read_text()  # a segment
    units = fine_run / "results" / "smoke" / "records" / "tiny" / "units"
    assert {p.parent.relative_to(units).as_posix() for p in units.rglob("decode.parquet")} == {
        f"{v}/{u}" for v in FINE_VARIANTS for u in ("auto", "bio", "meta", "empty")}
    coarse = smoke_run / "results" / "smoke" / "records" / "tiny"
    keys = ["variant", "probe_set", "item_id", "arm", "sample"]
    for kind, sort in (("decode", keys), ("token", [*keys[:4], "position"])):
        fine = pl.concat([pl.read_parquet(p) for p in units.rglob(f"{kind}.parquet")]).sort(sort)
        ref = pl.concat([pl.read_parquet(p) for p in coarse.glob(f"*/{kind}.parquet")])
        # the smoke run's base group also scored the hex canaries, which the slice does not audit
        ref = ref.filter(pl.col("variant").is_in([f"tiny/{v}" for v in FINE_VARIANTS])
                         & ~pl.col("arm").is_in(list(HEX_ARMS))).sort(sort)
        if kind == "token":
            assert_token_records_close(fine, ref)
        else:
            assert_frame_equal(fine, ref)


def test_fine_grain_new_or_changed_prefill_arm_runs_only_its_jobs(fine_run):
    prefills = yaml.safe_load((ROOT / "workflow_config.yaml").read_text())["probes"]["prefills"]
    jobs = planned_jobs(fine_run, merged(FINE, {"probes": {"prefills": {**prefills, "swap": "{other_bio}"}}}))
    n = len(FINE_VARIANTS)  # one decode and one teacher-forced job per variant for the new arm
    assert jobs == {"decode_pass": n, "teacher_forced_pass": n, "tables": 1, "plots": 1, "summary": 1, "all": 1}
    # and a changed prefill text re-runs that arm's jobs alone
    changed = {**prefills, "meta": "I recall the writer."}
    assert planned_jobs(fine_run, merged(FINE, {"probes": {"prefills": changed}})) == jobs


def test_fine_grain_new_k_runs_only_its_jobs(fine_run):
    """An appended K is one segment from the last K's state and the new
    variant's probe jobs; a K inserted before the last also re-runs the
    segments after it (their starting state changed)."""
    jobs = planned_jobs(fine_run, merged(FINE, {"unlearn": {"k": [3, 5, 8]}}))
    # the new variant's units: decode auto + 3 prefill arms; teacher-forced the 3 arms (a memorization
    # group's variant has no hex probes, so no teacher-forced AUTO unit)
    assert jobs == {"unlearn": 1, "variant_manifest": 1, "decode_pass": 4, "teacher_forced_pass": 3,
                    "tables": 1, "plots": 1, "summary": 1, "all": 1}
    inserted = planned_jobs(fine_run, merged(FINE, {"unlearn": {"k": [3, 4, 5]}}))
    assert inserted["unlearn"] == 2 and inserted["decode_pass"] == 8  # K=4 new, K=5 from K=4's state


def test_fine_grain_hex_sampling_reruns_no_model_job_without_hex_probes(fine_run):
    """The slice audits no hex canary (`audit.hex_canaries: false`), so no
    group runs the hex probes and a hex-sampling setting re-runs no model
    job (the views re-read the records against the new settings' hashes)."""
    jobs = planned_jobs(fine_run, merged(FINE, {"probes": {"decode": {"hit_k": 4}}}))
    assert jobs == {"tables": 1, "plots": 1, "summary": 1, "all": 1}


def test_paper_a_grid_plans_the_papers_jobs(smoke_run):
    """configs/paper_a.yaml, its two 7-8B paths pointed at a tiny local
    checkpoint: 2 models x 3 seeds x 3 templates, NPO on each template and GA
    on BIO, four K checkpoints per run, no hex-canary arm; per model, the
    planted controls of the first seed (4 trained, 5 variants, 1 group)."""
    base = str(smoke_run / "results" / "smoke" / "models" / "tiny" / "base")
    override = {"models": {"r1_qwen7b": {"path": base, "dtype": "float32"},
                           "r1_llama8b": {"path": base, "dtype": "float32"}}}
    jobs = planned_jobs(smoke_run, override, layer="configs/paper_a.yaml")
    assert plan_jobs(override, layer="configs/paper_a.yaml") == jobs  # the cost plan counts the same jobs
    # two never-trained references per (model, seed): BIO and META share one retain form, NONE has its own
    per_model_seed = {"mem": 3, "runs": 4, "references": 2, "variants": 3 + 4 * 4 + 2}
    # no hex canary audited: no group scores hex records, so no population of them is made
    assert jobs == {
        "synthetic_data": 1,
        "author_nonmembers": 1,
        "author_reference_lora": 2 * 3 * per_model_seed["references"],
        "memorize": 2 * 3 * per_model_seed["mem"],
        "control_lora": 2 * 4,
        "unlearn": 2 * 3 * per_model_seed["runs"],
        "variant_manifest": 2 * (1 + 3 * per_model_seed["variants"] + 5),
        "decode_pass": 2 * (1 + 3 * 3 + 1),     # base + one group per memorized adapter + the controls
        "teacher_forced_pass": 2 * (1 + 3 * 3 + 1),
        "tables": 1,
        "plots": 1,
        "summary": 1,
        "all": 1,
    }


def test_paper_b_grid_plans_the_papers_jobs(smoke_run):
    """configs/paper_b.yaml, its Qwen2.5-VL-7B path pointed at the smoke run's
    tiny local Qwen2.5-VL: the image data, one canary LoRA, 4 sources x 3
    seeds bSFT runs on the merged base (+ 3 on the undertrained one), 34
    cells x 3 seeds = 102 seed-level variants, paper B's six planted
    controls on the VL model (controls.on_vision), no paper A arms."""
    base = str(smoke_run / "results" / "smoke" / "models" / "tiny_vl" / "base")
    jobs = planned_jobs(smoke_run, {"models": {"qwen25vl_7b": {"path": base, "dtype": "float32"}}},
                        layer="configs/paper_b.yaml")
    assert plan_jobs({"models": {"qwen25vl_7b": {"path": base, "dtype": "float32"}}},
                     layer="configs/paper_b.yaml") == jobs  # the cost plan counts the same jobs
    assert jobs == {
        "synthetic_data": 1,
        "vision_data": 1,
        "populations": 1,
        "vision_nonmembers": 1,
        "canary_lora": 1,
        "reference_lora": 1,
        "bsft": 4 * 3 + 1 * 3,
        "control_hex_lora": 6,                   # C3, C4 and C5 and their negatives
        # base, canary, reference, undertrained canary, both merged bases, 34 cells x 3 seeds, the plants
        "variant_manifest": 6 + 34 * 3 + 6,
        "decode_pass": 1 + 3 + 1,                # base (+ canary adapters), one group per bSFT seed, the plants'
        "teacher_forced_pass": 1 + 3 + 1,
        "tables": 1,
        "plots": 1,
        "summary": 1,
        "all": 1,
    }


def test_invalid_value_stops_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"tables": {"parser": {"split": "middle"}}}))
    proc = run_snakemake(tmp_path, "-n", check=False, extra_configs=(bad,))
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "'middle' is not one of ['first', 'last']" in text and "parser" in text


def test_unknown_model_path_is_named(tmp_path):
    extra = tmp_path / "real.yaml"
    extra.write_text(yaml.safe_dump({"models": {"r1": {"path": "/models/absent"}}, "audit": {"models": ["r1"]}}))
    proc = run_snakemake(tmp_path, "-n", check=False, extra_configs=(extra,))
    assert proc.returncode != 0
    assert "`/models/absent` does not exist" in proc.stdout + proc.stderr


@pytest.mark.parametrize("override,message", [
    ({"audit": {"models": ["ghost"]}}, "`audit.models` names `ghost`"),
    ({"unlearn": {"runs": {"ga": {**SMOKE_RUNS["ga"], "retain_weight": 1.0}}}},
     "method `ga` does not use `retain_weight`"),
])
def test_bad_config_is_named_before_any_job(tmp_path, override, message):
    """The design's config errors (tests/test_design.py checks each one
    in-process) reach the user from a dry run in an empty folder."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(override))
    proc = run_snakemake(tmp_path, "-n", check=False, extra_configs=(bad,))
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


@pytest.mark.parametrize("entry,message", [
    ({"think_open": "<reasoning>"}, "model `local`: think tag `think_open` = '<reasoning>' is not a single token"),
    ({"chat_template": "<|user|>a question<|assistant|>"},
     "model `local`: its chat template does not place the user's text in the prompt"),
    ({"vision": True}, "`models.local.vision` is true, but"),  # image canaries asked of a text-only model
    ({"base": "tiny_vl"}, "is a vision-language checkpoint (its config.json has a vision_config); set "
                          "`models.local.vision: true`"),
])
def test_local_checkpoint_that_cannot_be_audited_is_named(smoke_run, tmp_path, entry, message):
    """A local checkpoint (here the smoke run's own base) with a think tag its
    tokenizer splits, a chat template that drops the prompt, or a `vision`
    flag its config contradicts, is refused before any job."""
    entry = dict(entry)
    base = smoke_run / "results" / "smoke" / "models" / entry.pop("base", "tiny") / "base"
    extra = tmp_path / "real.yaml"
    extra.write_text(yaml.safe_dump({
        "models": {"local": {"path": str(base), **entry}},
        "audit": {"models": ["local"]},
    }))
    proc = run_snakemake(smoke_run, "-n", check=False, extra_configs=(extra,))
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_a_vision_language_only_audit_runs_to_its_end(smoke_run, tmp_path):
    """`audit.models: [tiny_vl]` alone: the design declares no paper A table
    (a vision-language model runs paper B's arms only), the tables job
    writes exactly the declared ones, and the run ends."""
    import shutil

    from test_design import design_of

    from canary_audit.publish.catalog import registry

    workdir = tmp_path / "run"
    shutil.copytree(smoke_run, workdir, symlinks=True)
    override = {"audit": {"models": ["tiny_vl"]}}
    declared = design_of(override).table_names()  # the smoke config with the override
    assert not {t.name for t in registry() if t.part == "paper_a"} & set(declared)
    assert planned_jobs(workdir, override) == {"tables": 1, "plots": 1, "summary": 1, "all": 1}
    run_snakemake(workdir, "--cores", "2", extra_configs=(workdir / "override.yaml",))
    tables = workdir / "results" / "smoke" / "tables"
    written = {p.stem for p in tables.glob("*.csv") if p.stat().st_mtime > (workdir / "override.yaml").stat().st_mtime}
    assert written == set(declared)
    assert pl.read_csv(tables / "hex_recall.csv")["variant"].str.starts_with("tiny_vl/").all()


def test_model_jobs_share_a_cards_memory_and_never_overflow_it(smoke_run, tmp_path):
    """With a (faked) GPU of 1,500 MiB, each model job of the embedded model
    asks for 1,024 (canary_audit/core/gpus.py): two decode passes that 2 cores
    would run side by side run one after the other; without a GPU they
    overlap."""
    import os
    import shutil
    import subprocess
    import sys

    from canary_audit.commands.status import parse

    def run(env_extra: dict) -> list:
        work = tmp_path / ("gpu" if env_extra else "cpu")
        shutil.copytree(smoke_run, work, symlinks=True)
        targets = [f"results/smoke/records/tiny/{g}/decode.parquet" for g in ("mem-bio-s0", "mem-none-s0")]
        for t in targets:
            (work / t).unlink()
        for log in (work / ".snakemake" / "log").glob("*.log"):
            log.unlink()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env_extra,
               "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
               "--configfile", str(ROOT / "workflow_config.yaml"), str(ROOT / "configs" / "smoke.yaml"),
               "--cores", "2", *targets]
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)
        log = sorted((work / ".snakemake" / "log").glob("*.snakemake.log"))[-1]
        jobs = sorted((j for j in parse(log).jobs.values() if j.rule == "decode_pass"), key=lambda j: j.started)
        assert len(jobs) == 2 and all(j.finished for j in jobs)
        return jobs

    first, second = run({"CANARY_AUDIT_GPU_MEM_MB": "1500"})
    assert second.started >= first.finished  # one at a time: 2 x 1,024 MiB > 1,500
    first, second = run({})
    assert second.started < first.finished  # the control: 2 cores run both at once


@pytest.mark.parametrize("layer", ["workflow_config.yaml", "configs/smoke.yaml", "configs/recovery.yaml"])
def test_the_cost_plan_counts_the_jobs_a_fresh_run_plans(tmp_path, layer):
    """`plan` counts, per rule, the jobs Snakemake's dry run plans on an
    empty results folder: the default audit, the smoke audit and the recovery attacks, both grains."""
    assert plan_jobs(layer=layer) == planned_jobs(tmp_path, layer=layer)
    fine = {"grain": "fine"}
    assert plan_jobs(fine, layer=layer) == planned_jobs(tmp_path, fine, layer=layer)


def test_under_coin_inclusion_each_seeds_jobs_read_its_own_data_folder(tmp_path):
    """Coin inclusion with two seeds (data/inclusion.py): `plan` counts the
    seeds' data folders, and every job that reads the authors names its
    seed's folder as `--data` (paper A's plants split by seed), the base's
    and paper B's jobs the data folder."""
    override = {"data": {"inclusion": "coin", "n_author_nonmembers": 0, "n_authors": 12},
                "audit": {"seeds": [0, 1]}, "controls": {"every_seed": True}}
    (tmp_path / "override.yaml").write_text(yaml.safe_dump(override))
    out = run_snakemake(tmp_path, "-n", "-p", extra_configs=(tmp_path / "override.yaml",)).stdout
    planned = {m.group(1): int(m.group(2)) for m in map(re.compile(r"^(\w+)\s+(\d+)$").match, out.splitlines())
               if m and m.group(1) not in ("total", "job")}  # the dry run's job stats, as planned_jobs reads them
    assert plan_jobs(override) == planned and planned["seed_data"] == 2
    read = {}
    for line in out.splitlines():
        job = re.search(r"canary_audit (\w+) .*--data (\S+) .*--out (\S+)", line)
        if job and job.group(1) in ("memorize", "unlearn", "control_lora", "decode_pass", "teacher_forced_pass"):
            read[(job.group(1), job.group(3))] = job.group(2)
    for (rule, out_path), data in read.items():
        seed = re.search(r"(?:-s|/controls-s|/mem-\w+-s)(\d)\b", out_path)
        group = out_path.split("/")[-2]
        if rule.endswith("_pass") and (group == "base" or group.startswith("bsft")):
            assert data.endswith("/data"), (rule, out_path, data)
        else:
            want = seed.group(1) if seed else "0"  # the first seed's plants keep the `controls` group
            assert data.endswith(f"/data/s{want}"), (rule, out_path, data)
    assert {r for r, _ in read} == {"memorize", "unlearn", "control_lora", "decode_pass", "teacher_forced_pass"}
    assert sum(d.endswith("/data/s1") for d in read.values()) >= 10


def test_a_claim_runs_only_the_claims_view_and_the_page(smoke_run):
    """Claims are judged from the finished tables: declaring one (or changing
    it) plans the claims job and the page, no model job and no table."""
    claim = {"id": "npo_forgets", "sentence": "NPO lowers out_acc", "measure": "out_acc",
             "variants": {"method": "npo", "template": "bio", "k": "max"}, "compare": "parent", "expect": "lower"}
    assert planned_jobs(smoke_run, {"claims": [claim]}) == {"claims": 1, "summary": 1, "all": 1}

"""The smoke audit of the text model (tests/cluster/text_only.yaml on the
smoke config) submitted to a real SLURM cluster through profiles/slurm.

Needs a running cluster (tests/cluster/start.sh starts a one-node one with
accounting; `.ci/run` does so and sets CANARY_AUDIT_SLURM=1, which turns a
missing cluster into a failure instead of a skip).  Checks that every job but
the Snakefile's localrules (`all` and the views) went through sbatch and
finished in SLURM's accounting, and that the records equal a local run's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, local_rules, run_snakemake
from test_robustness import records

pytestmark = [pytest.mark.workflow, pytest.mark.slurm]


TEXT_ONLY = ROOT / "tests" / "cluster" / "text_only.yaml"


def cluster_up() -> bool:
    if not shutil.which("sbatch"):
        return False
    return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0


# Copied from the local smoke run before the submission: the data and the
# embedded base (rules synthetic_data, author_nonmembers, populations and
# embedded_base), two links of the chain whose jobs under SLURM took 26 s
# plus their status polls.  The base class is the embedded model's alone (a
# real checkpoint is a path); the rules left to submit are every class a
# real model's audit submits.
COPIED = ("data", "models/tiny/base")
SUBMITTED = {"memorize", "author_reference_lora", "variant_manifest", "decode_pass", "teacher_forced_pass"}


@pytest.fixture(scope="module")
def slurm_run(smoke_run, tmp_path_factory):
    """(work dir, Snakemake's output, the rules its dry run planned)."""
    if not cluster_up():
        if os.environ.get("CANARY_AUDIT_SLURM") == "1":
            pytest.fail("CANARY_AUDIT_SLURM=1 but no SLURM cluster answers; run tests/cluster/start.sh")
        pytest.skip("no SLURM cluster here (start one with tests/cluster/start.sh)")
    workdir = tmp_path_factory.mktemp("slurm")
    for part in COPIED:
        shutil.copytree(smoke_run / "results" / "smoke" / part, workdir / "results" / "smoke" / part, symlinks=True)
    plan = run_snakemake(workdir, "-n", "--quiet", "rules", extra_configs=(TEXT_ONLY,)).stdout
    planned = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", plan, re.M)}
    # Snakemake ignores a plain SIGTERM while jobs run: the subprocess timeout
    # (SIGKILL) in run_snakemake bounds a hung run instead.
    proc = run_snakemake(
        workdir, "--profile", str(ROOT / "profiles" / "slurm"),
        # The first status poll after 8 s, when the light jobs (7 s under SLURM) are done; the
        # plugin adds 10 s per poll that finds none done, so a 12 s training job is seen at 26 s.
        "--slurm-init-seconds-before-status-checks", "8",
        "--default-resources", "slurm_partition=debug",
        extra_configs=(TEXT_ONLY,), timeout=1200,
    )
    return workdir, proc.stdout + proc.stderr, planned


def test_every_job_went_through_sbatch_and_finished(slurm_run):
    _, log, planned = slurm_run
    ids = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    assert {"all", "tables", "summary"} <= set(local_rules())
    # the copied rules are not planned; every class a real model's audit submits is
    assert set(planned) - {"total", *local_rules()} == SUBMITTED
    assert len(ids) == len(set(ids)) == planned["total"] - sum(planned.get(rule, 0) for rule in local_rules())
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
                           capture_output=True, text=True, check=True, timeout=60).stdout
    states = dict(line.split("|", 1) for line in sacct.split())
    assert set(states) == set(ids)
    assert set(states.values()) == {"COMPLETED"}
    # Every job started in its own allocation: no warm-start server under a
    # cluster executor (the local smoke run's jobs were warm-started).
    logs = sorted((slurm_run[0] / "results" / "smoke" / "logs").rglob("*.log"))
    assert logs and not any("warm start" in log.read_text(errors="replace") for log in logs)


def test_records_equal_a_local_run(slurm_run, smoke_run):
    import polars as pl

    workdir, _, _ = slurm_run
    there = records(workdir)
    # the text model's base and BIO memorization groups x 2 passes (tests/cluster/text_only.yaml),
    # each equal to the full smoke run's rows of the same variants and probe sets (its groups hold
    # more: the unlearned checkpoints, the hex canary adapters and probes)
    key = pl.concat_str("variant", "probe_set", separator="|")
    here = {name: frame.filter(key.is_in(there[name].select(key).to_series().unique().to_list()))
            for name, frame in records(smoke_run).items() if name in there}
    assert here.keys() == there.keys() and len(here) == 4
    for name, frame in here.items():
        assert there[name].height and frame.equals(there[name]), f"{name} differs from the local run"

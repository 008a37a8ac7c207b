"""Nothing lost, nothing silent: a second smoke run reproduces every record
bit for bit, and a run killed mid-job is neither mistaken for finished nor
lost (`--rerun-incomplete` completes it)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import polars as pl
import pytest
import yaml
from conftest import ROOT, run_snakemake

pytestmark = pytest.mark.workflow


def records(workdir):
    root = workdir / "results" / "smoke" / "records"
    return {p.relative_to(root): pl.read_parquet(p) for p in sorted(root.rglob("*.parquet"))}


# The probe group the second run rebuilds: the vision-language model's base
# group (the embedded text model's build it stands on, its own build, its
# canary LoRA and reference, the image and text hex probes).  The text
# model's records are rebuilt cold by tests/test_slurm.py where a cluster
# answers, as in CI (every job under SLURM starts cold; its memorization and
# base groups equal the warm smoke run's bit for bit), and its text canary
# LoRA trains by the VL one's code.
# Left out to keep the cold run short: the bSFT groups, and the
# memorization branch, whose training is checked bit for bit elsewhere (a
# memorization LoRA forked and fresh: test_warm; unlearning whole and
# killed-and-resumed: test_training).
SECOND_RUN = ("tiny_vl/base",)


def test_second_run_reproduces_every_record_bitwise(smoke_run, tmp_path):
    """Same seeds, same config, fresh work dir: identical decode records and
    bitwise-identical token records (log-probs, ranks) and weight fingerprints.
    The second run starts every job cold (`warm_start: false`), the first
    forked them from the warm server: the warm start changes no record."""
    cold = tmp_path / "cold.yaml"
    cold.write_text("warm_start: false\n")
    targets = [f"results/smoke/records/{group}/{kind}.parquet" for group in SECOND_RUN for kind in ("decode", "token")]
    run_snakemake(tmp_path, "--cores", "2", *targets, extra_configs=(cold,))
    assert "warm start" not in (tmp_path / "results" / "smoke" / "logs" / "tiny_vl" / "canary-s0.log").read_text()
    first, second = records(smoke_run), records(tmp_path)
    assert len(second) == 2 and set(second) <= set(first)
    for name, frame in second.items():
        assert frame.equals(first[name]), f"{name} differs between two runs of the same config"


def test_killed_job_is_not_mistaken_for_finished(smoke_run, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(smoke_run, work, ignore=shutil.ignore_patterns("override.yaml", "bad.yaml"))
    extra = tmp_path / "graddiff.yaml"
    # Cold start: the kill must land inside the job, before its outputs, and a
    # warm-started job finishes within the wait below (test_warm.py kills
    # warm-started jobs).
    extra.write_text(yaml.safe_dump({"unlearn": {"runs": {"graddiff": {"method": "graddiff", "templates": ["bio"]}}},
                                     "warm_start": False}))
    configs = [str(ROOT / "workflow_config.yaml"), str(ROOT / "configs" / "smoke.yaml"), str(extra)]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
           "--configfile", *configs, "--cores", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = work / "results" / "smoke" / "logs" / "tiny" / "unlearn-graddiff-bio-s0.log"
    proc = subprocess.Popen(cmd + ["--", "results/smoke/models/tiny/adapters/graddiff-bio-s0-k5"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not log.exists():
        time.sleep(0.1)
    assert log.exists(), "the unlearning job never started"
    time.sleep(2.0)  # inside the job (its imports alone take longer), before any output
    os.killpg(proc.pid, signal.SIGKILL)  # the node dies: no clean-up of any kind
    proc.wait()

    adapters = work / "results" / "smoke" / "models" / "tiny" / "adapters"
    for out in adapters.glob("graddiff-bio-s0-k*"):  # outputs appear by atomic rename, whole or not at all
        assert (out / "adapter_model.safetensors").is_file()
    dry = run_snakemake(work, "-n", extra_configs=(extra,), check=False)
    text = dry.stdout + dry.stderr
    # Snakemake either plans the job again (no output yet) or refuses to go on
    # until told what to do with the incomplete output: never "nothing to do".
    assert "Nothing to be done" not in text
    assert re.search(r"^unlearn\s+1$", text, re.M) or "incomplete" in text.lower(), text[-2000:]
    # What a user does after a crash: release the dead run's lock, re-run
    # (warm-started: `warm_start` is no rerun trigger, and the kill is done).
    run_snakemake(work, "--unlock", extra_configs=(extra,))
    warm = tmp_path / "graddiff_warm.yaml"
    warm.write_text(yaml.safe_dump({"unlearn": {"runs": {"graddiff": {"method": "graddiff", "templates": ["bio"]}}}}))
    run_snakemake(work, "--cores", "2", "--rerun-incomplete", "results/smoke/tables/canary_leakage.csv",
                  extra_configs=(warm,))
    for k in (3, 5):
        assert (adapters / f"graddiff-bio-s0-k{k}" / "adapter_model.safetensors").is_file()
    assert not (adapters / ".graddiff-bio-s0-k5.resume").exists()
    leakage = pl.read_csv(work / "results" / "smoke" / "tables" / "canary_leakage.csv")
    assert {"tiny/graddiff-bio-s0-k3", "tiny/graddiff-bio-s0-k5"} <= set(leakage["variant"])

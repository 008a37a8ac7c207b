"""The package installed as a user without the checkout gets it (`pip
install .`, not editable): its data files travel with it, and the commands
the workflow's rules run work from it, outside the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

R = "results/smoke"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package built from a copy of the checkout's package files (a
    build writes `build/` beside its sources) and installed, not editable,
    into a folder of its own (its dependencies are the suite's)."""
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", str(target), str(source)], check=True)  # built as pip builds it for a user
    return target


def run(installed, cwd, *args):
    """`python -m canary_audit ...` from `cwd`, importing only the installed copy."""
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, "-m", "canary_audit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


def test_a_non_editable_install_plans_a_config(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    where = subprocess.run([sys.executable, "-c", "import canary_audit; print(canary_audit.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(installed))
    for name in ("design/config.schema.yaml", "design/throughput.json", "verdicts/paper_a.yaml",
                 "verdicts/paper_b.yaml", "verdicts/readme_result.md", "commands/job_seconds.json",
                 "verdicts/floors.json"):
        assert (installed / "canary_audit" / name).is_file(), name
    proc = run(installed, tmp_path, "plan", "--configfile", str(ROOT / "workflow_config.yaml"),
               str(ROOT / "configs" / "smoke.yaml"), "--out", str(tmp_path / "plan.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| **total** |" in proc.stdout and json.loads((tmp_path / "plan.json").read_text())
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: {parser: {split: middle}}\n")
    refused = run(installed, tmp_path, "plan", "--configfile", str(ROOT / "workflow_config.yaml"), str(bad))
    assert refused.returncode != 0 and "'middle' is not one of" in refused.stderr  # the shipped schema checks it


def test_a_non_editable_install_tabulates_and_summarizes_a_run(installed, smoke_run, tmp_path):
    """The smoke run's records, re-tabulated and summarized by the installed
    copy (the tables and summary rules' commands), give the run's tables
    (floats within 1e-9 relative: sums may be ordered otherwise)."""
    import polars as pl
    from polars.testing import assert_frame_equal

    tables = smoke_run / R / "tables"
    records = smoke_run / R / "records"
    out = tmp_path / "tables"
    proc = run(installed, tmp_path, "tables", "--params", f"@{tables / 'view_config.json'}",
               "--decode", *map(str, sorted(records.rglob("decode.parquet"))),
               "--tokens", *map(str, sorted(records.rglob("token.parquet"))), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("canary_leakage", "bsft_matrix", "controls"):
        # the same computation in another process and thread count: floats to a stated tolerance
        assert_frame_equal(pl.read_csv(out / f"{name}.csv"), pl.read_csv(tables / f"{name}.csv"),
                           check_exact=False, rel_tol=1e-9, abs_tol=1e-12)
    proc = run(installed, tmp_path, "summary", "--tables", str(out), "--out", str(tmp_path / "summary.md"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## The papers' numbers beside this run" in (tmp_path / "summary.md").read_text()

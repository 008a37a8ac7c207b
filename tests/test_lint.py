"""The lint CI runs, in the test command too: a file that ruff or snakefmt
would change fails here, where a developer runs the tests, and not first in
CI (stop 47's CI failed on one rules file snakefmt reformats)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean():
    done = _run("ruff", "check", "src", "tests", "benchmarks")
    assert done.returncode == 0, done.stdout + done.stderr


def test_snakefmt_leaves_the_rules_unchanged():
    done = _run("snakefmt", "--check", "Snakefile", "rules/")
    assert done.returncode == 0, done.stdout + done.stderr


def test_snakemake_lint_is_clean():
    """.ci/run lints the workflow too (`snakemake --lint`, which exits 1 on
    any lint): a '+' that composes a shell line reads to it as a path."""
    done = _run("snakemake", "--lint", "--configfile", "workflow_config.yaml", "configs/smoke.yaml")
    assert done.returncode == 0, done.stdout + done.stderr

"""Shared fixtures: a tiny tokenizer and model built locally (no hub), and the
smoke workflow run once per test session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


# The slow tier (`-m workflow`): every test that runs Snakemake (a dry run
# apart), a training loop over 50 steps or a SLURM job.  A test module marks
# its own (`pytestmark`), a test that runs one itself carries the marker, and
# a fixture that runs one marks every test using it.  run_snakemake refuses
# to run a workflow for an unmarked test, so the fast tier
# (`-m "not workflow"`) cannot grow one unnoticed.
WORKFLOW_FIXTURES = ("smoke_run", "own_run", "imported_run")
_running: list[pytest.Item] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if set(WORKFLOW_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.workflow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> tuple[Path, Path]:
    """(data dir, model dir): synthetic data and a barely trained embedded-
    architecture model with its tokenizer, built locally (no hub)."""
    from canary_audit.data.io import write_author_nonmembers, write_populations, write_synthetic
    from canary_audit.model.embedded import build_embedded

    data = tmp_path_factory.mktemp("data")
    write_synthetic(data, {"seed": 0, "n_authors": 4, "n_distractors": 10, "n_retain": 8, "n_hex_canaries": 3,
                           "n_bsft_per_source": 3})
    write_populations(data, data, {"seed": 0, "n_hex_canaries": 3, "n_hex_nonmembers": 4, "n_exposure_candidates": 5})
    write_author_nonmembers(data, data, {"seed": 0, "n_author_nonmembers": 3})
    model = tmp_path_factory.mktemp("model") / "tiny"
    build_embedded(model, data, {
        "seed": 0, "head_tokens": 6, "threads": 1,
        "tokenizer": {"vocab_size": 800},
        "architecture": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                         "intermediate_size": 64, "max_positions": 256},
        "pretrain": {"steps": 2, "batch_size": 4, "lr": 1e-3, "max_length": 256,
                     "n_hex_records": 20, "n_copy": 10},
    }, seed=0)
    return data, model


@pytest.fixture(scope="session")
def tiny_vl_assets(tiny_assets, tmp_path_factory) -> tuple[Path, Path]:
    """(data dir, model dir): the image data beside `tiny_assets`' data and a
    tiny Qwen2.5-VL built on its text model, as the workflow builds them."""
    from canary_audit.data.images import write_image_nonmembers, write_vision_data
    from canary_audit.model.vision import build_from_text

    data, text_model = tiny_assets
    if not (data / "vision").exists():
        write_vision_data(data / "vision", data, {"seed": 0, "n_image_canaries": 3})
        write_image_nonmembers(data / "vision_nonmembers", data, {"seed": 0, "n_hex_nonmembers": 4})
    model = tmp_path_factory.mktemp("model") / "tiny_vl"
    build_from_text(text_model, model, {"seed": 0, "vision_tower": {"depth": 1, "hidden_size": 32,
                                                                    "intermediate_size": 64, "num_heads": 2}})
    return data, model


def local_rules() -> list[str]:
    """The Snakefile's `localrules:` (run by the submitting host, not sbatch)."""
    block = re.search(r"^localrules:\n((?:    \w+,\n)+)", (ROOT / "Snakefile").read_text(), re.M)
    return re.findall(r"(\w+),", block.group(1))


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, extra_configs: tuple[Path, ...] = (),
    layer: str = "configs/smoke.yaml", timeout: int = 900,
) -> subprocess.CompletedProcess:
    """Snakemake on this repository's Snakefile and the default config with
    `layer` (the smoke config unless told) and `extra_configs` on top, with
    outputs under `workdir`.  Refused (a dry run apart) for a test the slow
    tier does not hold: mark it `workflow` or add its fixture to
    WORKFLOW_FIXTURES."""
    if "-n" not in args and _running and _running[0].get_closest_marker("workflow") is None:
        raise AssertionError(f"{_running[0].nodeid} runs Snakemake but is not marked `workflow` (the slow tier): "
                             "mark it, or add the fixture that runs it to conftest.WORKFLOW_FIXTURES")
    configs = [str(ROOT / "workflow_config.yaml"), str(ROOT / layer), *map(str, extra_configs)]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", *configs, *args]
    # Jobs run `python -m canary_audit`: the interpreter running this must be
    # the one on PATH, with the package importable.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = _forked_snakemake(cmd, env, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


_FORK_SERVER = None


def _forked_snakemake(cmd: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """`cmd` (`python -m snakemake ...`) in a child of a fork server that
    imported Snakemake once (tests/snakemake_fork.py says why); the same
    outcome as running it with subprocess.run."""
    import multiprocessing
    import tempfile

    import snakemake_fork

    global _FORK_SERVER
    if _FORK_SERVER is None:
        _FORK_SERVER = multiprocessing.get_context("forkserver")
        _FORK_SERVER.set_forkserver_preload(["snakemake_fork", "snakemake.cli"])
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        child = _FORK_SERVER.Process(target=snakemake_fork.run, args=(cmd[3:], env, str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, child.exitcode, out.read_text(), err.read_text())


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """The whole DAG on configs/smoke.yaml, run once; returns the work dir."""
    workdir = tmp_path_factory.mktemp("smoke")
    run_snakemake(workdir, "--cores", "2")
    return workdir


# Token records of one unit scored in different batch compositions (alone vs
# with every other unit, or on another CPU's kernels) agree to float rounding,
# not bitwise: log-probs within this many nats, and a rank or top-1 id differs
# only at a near-tie, on at most this share of tokens.
LOGPROB_ATOL = 1e-4
TIE_FLIP_SHARE = 0.005


def assert_token_records_close(got, want) -> None:
    """`got` equals `want` in every column but the float ones (log-probs
    and their distribution's mean and variance, within LOGPROB_ATOL) and the
    near-tie-sensitive ones (rank, top-1 id: on at most TIE_FLIP_SHARE of
    tokens)."""
    from polars.testing import assert_frame_equal

    assert got.height == want.height > 0
    floats = ["logprob", "top1_logprob", "vocab_mean_logprob", "vocab_var_logprob"]
    ties = ["rank", "top1_id"]
    assert_frame_equal(got.drop(floats + ties), want.drop(floats + ties))
    assert_frame_equal(got.select(floats), want.select(floats), abs_tol=LOGPROB_ATOL, rel_tol=0)
    for column in ties:
        flips = (got[column] != want[column]).sum()
        assert flips <= TIE_FLIP_SHARE * got.height, f"{column}: {flips} of {got.height} tokens differ"

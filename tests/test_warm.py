"""Warm start (canary_audit.commands.warm): a model job forked from the warm server
writes the same bytes as a fresh process, keeps its exit status and output,
stops when its client is stopped or killed, and anything the server cannot
serve runs in its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from canary_audit.commands import warm

MEMORIZE = {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "lr": 0.005, "steps": 3, "batch_forget": 4,
            "batch_retain": 2, "template": "bio", "seed": 0, "head_tokens": 6}


def model_arg(model: Path) -> str:
    return json.dumps({"name": "tiny", "path": str(model), "dtype": "float32", "think_open": "<think>",
                       "think_close": "</think>", "chat_template": None, "trust_remote_code": False})


def job(argv: list[str], sock: Path | None, **kwargs):
    """`python -m canary_audit argv`, the way a rule runs it; with `sock`,
    as a job of the run that started that server."""
    env = {k: v for k, v in os.environ.items() if k != warm.ENV_VAR}
    env["PYTHONPATH"] = str(ROOT / "src")
    if sock is not None:
        env[warm.ENV_VAR] = str(sock)
    return subprocess.Popen([sys.executable, "-m", "canary_audit", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def start_server(tmp: Path, extra_path: str | None = None) -> Path:
    """A server as Snakemake's `onstart` starts one (it inherits this
    process' environment); `extra_path` makes its import path differ."""
    sock = tmp / "server.sock"
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), extra_path) if p)
    try:
        warm.start(sock, tmp / "server.log")
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert time.monotonic() < deadline, (tmp / "server.log").read_text()
        time.sleep(0.2)
    return sock


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = Path(tmp_path_factory.mktemp("warm"))
    sock = start_server(tmp)
    yield sock
    warm.stop(sock)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def server_pid(sock: Path) -> int:
    return int(sock.with_name(sock.name + ".pid").read_text())


def test_forked_job_writes_what_a_fresh_process_writes(server, tiny_assets, tmp_path):
    data, model = tiny_assets
    outs = {}
    for mode, sock in (("warm", server), ("fresh", None)):
        out = tmp_path / mode
        proc = job(["memorize", "--model", model_arg(model), "--params", json.dumps(MEMORIZE), "--data",
                    str(data), "--out", str(out)], sock)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        assert ("warm start: memorize job peak RSS" in stderr) == (mode == "warm"), stderr
        outs[mode] = (out / "adapter_model.safetensors").read_bytes()
    # Same seeds, same code, same bytes: the fork inherits no used random state.
    assert outs["warm"] == outs["fresh"]


def test_failing_job_keeps_its_exit_status_and_traceback(server, tiny_assets, tmp_path):
    data, model = tiny_assets
    argv = ["memorize", "--model", model_arg(model), "--params", json.dumps(MEMORIZE), "--data",
            str(tmp_path / "no-such-data"), "--out", str(tmp_path / "out")]
    results = {}
    for mode, sock in (("warm", server), ("fresh", None)):
        proc = job(argv, sock)
        _, stderr = proc.communicate(timeout=300)
        results[mode] = (proc.returncode, "FileNotFoundError" in stderr, "no-such-data" in stderr)
    assert results["warm"] == results["fresh"] == (1, True, True)


LONG_BASE = {"seed": 0, "head_tokens": 6, "tokenizer": {"vocab_size": 800},
             "architecture": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
                              "max_positions": 256},
             "pretrain": {"steps": 100000, "batch_size": 4, "lr": 1e-3, "max_length": 256, "n_hex_records": 20,
                          "n_copy": 10}}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_stopped_or_killed_client_stops_its_job(server, tiny_assets, tmp_path, how):
    """Snakemake cancels a job by signalling its process: the forked job must
    not outlive it, whether the client forwards the signal (SIGTERM) or dies
    at once (SIGKILL: the job sees its connection close)."""
    data, _ = tiny_assets
    before = set(children(server_pid(server)))
    proc = job(["embedded_base", "--params", json.dumps(LONG_BASE), "--data", str(data), "--out", str(tmp_path / "m"),
                "--summary", str(tmp_path / "s.json")], server)
    deadline = time.monotonic() + 60
    while not (set(children(server_pid(server))) - before):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.0)  # the job is past its start and training
    proc.send_signal(getattr(signal, how))
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 30
    while set(children(server_pid(server))) - before:
        assert time.monotonic() < deadline, "the forked job outlived its client"
        time.sleep(0.1)
    assert not (tmp_path / "s.json").exists()


def test_without_a_usable_server_the_job_runs_in_its_own_process(tiny_assets, tmp_path):
    data, model = tiny_assets
    argv = ["memorize", "--model", model_arg(model), "--params", json.dumps(MEMORIZE), "--data", str(data)]
    # No server at the socket (none started, or stopped): no wait, a fresh run;
    # started first, it runs beside the server's start and the second job.
    missing = job([*argv, "--out", str(tmp_path / "a")], tmp_path / "missing.sock")
    # A server with another import path than the job's refuses it.
    other = tmp_path / "other"
    other.mkdir()
    sock = start_server(other, extra_path=str(tmp_path))
    try:
        refused = job([*argv, "--out", str(tmp_path / "b")], sock)
        for proc in (missing, refused):
            _, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0 and "warm start" not in stderr, stderr
    finally:
        warm.stop(sock)
    assert (tmp_path / "b" / "adapter_model.safetensors").is_file()


def test_only_linux_machines_without_a_gpu_start_a_server(monkeypatch):
    monkeypatch.setattr(warm, "nvidia_devices", lambda: [])
    assert warm.supported() == sys.platform.startswith("linux")
    monkeypatch.setattr(warm, "nvidia_devices", lambda: ["/dev/nvidia0"])
    assert not warm.supported()


def test_a_forked_job_takes_its_own_thread_count(monkeypatch):
    """Snakemake sets OMP_NUM_THREADS per job; a fresh process's OpenMP reads
    it at import, a forked one would keep the server's, so the child applies
    it (here: the child's step, in this process)."""
    import torch

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
            warm._apply_thread_env()
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_nothing_imported_before_the_fork_starts_a_thread_or_imports_polars():
    """The server forks jobs after `_preload` and the client side runs
    `__main__` and `warm.run_via_server`: a fork is safe only while that
    process has one thread and no polars (whose threads a fork would leave
    locked). A new import that breaks either fails here, in a fresh
    interpreter, not as a hang in a job."""
    probe = ("import sys, pathlib\n"
             "import canary_audit.commands.warm as warm\n"
             "warm._preload()\n"
             "threads = len(list(pathlib.Path('/proc/self/task').iterdir()))\n"
             "print(threads, sorted(m for m in ('polars', 'pyarrow') if m in sys.modules))\n")
    # numpy's and scipy's OpenBLAS start worker threads at import and stop
    # them around a fork (pthread_atfork); pinned to none here, every thread
    # left is someone else's (torch's OpenMP pool, a tokenizer's, polars').
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=env).stdout.split(maxsplit=1)
    assert out == ["1", "[]\n"], out
    # The entry point imports the warm client only when a server is set.
    entry = subprocess.run([sys.executable, "-X", "importtime", "-m", "canary_audit", "status", "--help"],
                           capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                                if k != warm.ENV_VAR})
    assert "canary_audit.commands.warm" not in entry.stderr

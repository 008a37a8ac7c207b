"""Warm start for jobs run on this machine: one server process imports torch,
transformers and peft once and forks a child per model job, so a job skips
the imports that are most of a short job's start-up (a fresh interpreter
spends ~7 s importing them on the 2-core machine; see docs/performance.md).

The Snakefile starts the server when the run executes its jobs locally
(`warm_start: true`; never under a cluster executor) and sets CANARY_AUDIT_WARM
to its socket.  `python -m canary_audit <model command>` then hands the server
its arguments, working directory, environment and its stdin/stdout/stderr, and
waits for the child's exit status, forwarding SIGINT/SIGTERM/SIGHUP to it.  A
forked child runs exactly the code a fresh process runs, with the job's own
environment; outputs are the same either way (tested).  Without a server that
answers (unset, stopped, another interpreter, inside a SLURM job) the command
runs in its own process as before.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from canary_audit.core.jobs import MODEL_JOBS

ENV_VAR = "CANARY_AUDIT_WARM"
# Commands that load a model: the only ones whose start-up the imports dominate.
MODEL_COMMANDS = frozenset(MODEL_JOBS)
# How long a job waits for a server that is still importing (its pid is
# alive, its socket not bound yet) before it starts on its own.
STARTUP_WAIT_S = 30.0
_HEADER = struct.Struct("!I")


def supported() -> bool:
    """Linux without an NVIDIA device only.  Fork after importing torch is
    what Linux jobs do anyway (DataLoader workers); macOS' system libraries
    are not fork-safe.  On a GPU machine a CUDA driver initialized in the
    server (an import that asks `torch.cuda.is_available()`) would break CUDA
    in every forked job, this has not been tried on a GPU, and a GPU job's
    start-up is small against its work: such jobs start fresh."""
    return sys.platform.startswith("linux") and not nvidia_devices()


def nvidia_devices() -> list[str]:
    return sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))


def _preload() -> None:
    """Import what model jobs import, without running any tensor operation:
    no intra-op thread pool exists before the fork.  polars and pyarrow are
    left to each job (~0.4 s): importing them starts allocator and cleanup
    threads, and polars is not fork-safe once its threads exist.  numpy's
    and scipy's OpenBLAS start worker threads at import; OpenBLAS stops and
    restarts them around a fork itself (pthread_atfork).  A test holds the
    rest: tests/test_warm.py, no other thread and no polars after this."""
    import numpy  # noqa: F401
    import peft  # noqa: F401
    import safetensors.torch  # noqa: F401
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401


def _threads() -> list[str]:
    """Names of this process' threads (Linux): what a fork leaves behind."""
    tasks = Path("/proc/self/task")
    return [(t / "comm").read_text().strip() for t in sorted(tasks.iterdir())]


def _send(conn: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    body = json.dumps(message).encode()
    head = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(conn, [head], list(fds))
    else:
        conn.sendall(head)
    conn.sendall(body)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _recv(conn: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    if max_fds:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, max_fds)
        if not head:
            raise EOFError("connection closed")
        head += _recv_exact(conn, _HEADER.size - len(head))
    else:
        head, fds = _recv_exact(conn, _HEADER.size), []
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exact(conn, size)), fds


def _interpreter() -> dict:
    return {"executable": os.path.realpath(sys.executable), "prefix": sys.prefix, "path": sys.path[1:]}


def serve(sock_path: Path, parent: int) -> None:
    """Import, bind `sock_path`, fork a child per connection; exit when the
    process that started the server (`parent`, Snakemake) is gone."""
    t0 = time.perf_counter()
    _preload()
    print(f"warm start: imports done in {time.perf_counter() - t0:.1f}s, pid {os.getpid()}, "
          f"threads {_threads()}", flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `stop`: clean up below
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = sock_path.with_name(sock_path.name + ".bind")
    tmp.unlink(missing_ok=True)
    server.bind(str(tmp))
    server.listen(64)
    tmp.rename(sock_path)  # clients see the socket only once it accepts
    server.settimeout(1.0)
    try:
        while os.getppid() == parent:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            if os.fork() == 0:
                code = 1
                try:  # nothing the child raises may reach the server's cleanup below
                    server.close()
                    for sig in (signal.SIGCHLD, signal.SIGTERM):  # a job dies of SIGTERM as a fresh one does
                        signal.signal(sig, signal.SIG_DFL)
                    code = _child(conn)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            conn.close()
    finally:  # also when Snakemake died without calling `stop`
        sock_path.unlink(missing_ok=True)
        sock_path.with_name(sock_path.name + ".pid").unlink(missing_ok=True)
        try:
            sock_path.parent.rmdir()
        except OSError:
            pass  # not empty (the server log, in tests): the caller's to remove


def _apply_thread_env() -> None:
    """Give torch the job's thread counts.  A fresh process's OpenMP reads
    OMP_NUM_THREADS (which Snakemake sets to the job's threads) when torch
    is imported; in a fork that import happened in the server, under the
    server's environment, so the job's values are applied here, before its
    first tensor operation (no thread pool exists yet: `_preload`)."""
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
        try:
            torch.set_num_interop_threads(int(threads))
        except RuntimeError:  # already fixed in this process: the intra-op count is what jobs use
            pass


def _child(conn: socket.socket) -> int:
    """Become the job: the client's fds, cwd, environment and argv; run the
    command as `python -m canary_audit` would; report the exit status."""
    conn.settimeout(None)
    request, fds = _recv(conn, max_fds=3)
    if request["interpreter"] != _interpreter():
        _send(conn, {"refused": "the job runs another interpreter or import path than the warm server"})
        return 0
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    sys.path[0] = request["path0"]  # `python -m` puts the job's working directory first
    os.environ.clear()
    os.environ.update(request["env"])
    _apply_thread_env()
    # A fresh interpreter seeds `random` from the OS; so does each job.  (Our
    # code draws only from explicitly seeded generators; torch's default one
    # is unused in the server, so the job starts from its usual seed.)
    random.seed()
    sys.argv = ["canary_audit", *request["argv"]]
    _send(conn, {"pid": os.getpid()})
    # The client's connection closes only when it exits: if it dies (killed
    # by Snakemake), the job stops too.
    threading.Thread(target=_stop_when_closed, args=(conn,), daemon=True).start()
    from canary_audit.commands.cli import main

    try:
        code = main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:  # what a fresh interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Snakemake's benchmark files measure the client, not this process: the
    # job's memory is reported here (benchmarks/end_to_end.py reads it).
    print(f"warm start: {request['argv'][0]} job peak RSS {peak_mb:.0f} MB", file=sys.stderr, flush=True)
    _send(conn, {"exit": code})
    return code


def _stop_when_closed(conn: socket.socket) -> None:
    try:
        conn.recv(1)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _connect(sock_path: Path) -> socket.socket | None:
    """A connection to the server; waits while a live server is still
    importing; None when there is none."""
    pid_file = sock_path.with_name(sock_path.name + ".pid")
    deadline = time.monotonic() + STARTUP_WAIT_S
    while True:
        if sock_path.exists():
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(sock_path))
                return conn
            except OSError:
                conn.close()
                return None
        if time.monotonic() > deadline or not _alive(pid_file):
            return None
        time.sleep(0.1)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def run_via_server(argv: list[str]) -> int | None:
    """The exit status of `argv` run by the warm server, or None where this
    process must run it itself."""
    path = os.environ.get(ENV_VAR)
    if not path or not argv or argv[0] not in MODEL_COMMANDS or "SLURM_JOB_ID" in os.environ:
        return None
    conn = _connect(Path(path))
    if conn is None:
        return None
    with conn:
        try:
            _send(conn, {"argv": argv, "cwd": os.getcwd(), "path0": sys.path[0], "env": dict(os.environ),
                         "interpreter": _interpreter()}, fds=[0, 1, 2])
            reply, _ = _recv(conn)
        except (OSError, EOFError):
            return None  # the server went away before the job started
        if "refused" in reply:
            return None
        pid = reply["pid"]
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
        try:
            return int(_recv(conn)[0]["exit"])
        except (OSError, EOFError):
            print(f"warm start: job process {pid} ended without an exit status (killed?)", file=sys.stderr)
            return 1


def start(sock_path: Path, log_path: Path) -> None:
    """Start a server for the calling process (Snakemake) in the background;
    its pid goes to `<socket>.pid`, which jobs check while it imports."""
    import subprocess

    sock_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "canary_audit.commands.warm", str(sock_path), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    sock_path.with_name(sock_path.name + ".pid").write_text(str(proc.pid))


def stop(sock_path: Path) -> None:
    """Stop the server (jobs it forked have finished when Snakemake calls this)."""
    pid_file = sock_path.with_name(sock_path.name + ".pid")
    try:
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    pid_file.unlink(missing_ok=True)
    sock_path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))


# The server a workflow run started (its socket), if any.
_STARTED: list[Path] = []


def start_for_workflow(workflow, enabled: bool, log_path: Path) -> None:
    """Start a server when this Snakemake run executes model jobs on this
    machine (`enabled`: the config's `warm_start`); jobs find it through the
    environment they inherit.  Never under a cluster executor (jobs that
    Snakemake spawns remotely run with --no-hooks), for `--touch`, or when
    no model job is to run."""
    import tempfile

    if not (enabled and supported() and workflow.local_exec) or workflow.touch:
        return
    if not any(job.rule.name in MODEL_JOBS for job in workflow.dag.needrun_jobs()):
        return
    sock = Path(tempfile.mkdtemp(prefix="canary-warm-")) / "server.sock"
    start(sock, log_path)
    os.environ[ENV_VAR] = str(sock)
    _STARTED.append(sock)


def stop_for_workflow() -> None:
    """Stop the server `start_for_workflow` started (Snakemake's onsuccess
    and onerror hooks)."""
    import shutil

    while _STARTED:
        sock = _STARTED.pop()
        stop(sock)
        shutil.rmtree(sock.parent, ignore_errors=True)
        os.environ.pop(ENV_VAR, None)

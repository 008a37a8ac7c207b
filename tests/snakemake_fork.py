"""One Snakemake command, run in a process forked from the tests' fork server.

Importing Snakemake costs ~2.5 s (its executor plugins included) and the
suite starts Snakemake some sixty times, most of them for a dry run that
takes ~1.5 s after the import.  conftest.run_snakemake therefore starts each
command in a child of a multiprocessing fork server that imported Snakemake
once (this module and `snakemake.cli` are its preload); the child is a
fresh process in every other respect: its own environment, working
directory, standard output and error (files the parent reads back), and
exit status.  This module imports nothing heavy, so the server loads it
without the test modules' imports.
"""

from __future__ import annotations

import os
import sys


def run(argv: list[str], env: dict[str, str], out_path: str, err_path: str) -> None:
    """`python -m snakemake argv` in this (forked) process, with `env` as its
    environment and its output in the two files; exits with its status."""
    for path, fd in ((out_path, 1), (err_path, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    from snakemake.cli import main

    code = 1
    try:
        main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

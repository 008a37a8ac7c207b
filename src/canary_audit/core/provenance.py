"""Which code and which weights made an artifact.

- `code_version()`: the package version, a hash of the `canary_audit` sources
  that are running, and the git commit when the package runs from a git
  checkout.  Records, variant manifests and training summaries carry it, so
  records written before a bug fix are told apart from records written
  after it (the tables list the versions they read and warn on a mix).
- `file_digest()`: the sha256 of a weight file, computed once per content: a
  cache entry keyed by the file's path, size and modification time answers
  every later request.  A 7B base is ~15 GB; without the cache every variant
  manifest and every probe pass of every variant read and hashed it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from functools import cache
from pathlib import Path

from canary_audit import __version__

PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def source_hash() -> str:
    """sha256 over the package's Python sources (relative path and bytes, in
    path order): what the running code is, whatever installed it."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@cache
def git_commit() -> str | None:
    """The commit of the git checkout the package runs from, if any (an
    editable install); None for an installed wheel or without git."""
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def code_version() -> str:
    """`<version>+src.<source hash>[.git.<commit>]`, e.g.
    `0.1.0+src.3f2a9c0d1b7e.git.a37bf86d0c12`.  The source hash decides
    whether two artifacts came from the same code; the commit says where to
    find it (an uncommitted edit changes the hash, not the commit)."""
    commit = git_commit()
    return f"{__version__}+src.{source_hash()}" + (f".git.{commit}" if commit else "")


def file_digest(path: Path, cache_dir: Path | None = None) -> str:
    """sha256 of the file at `path`, from `cache_dir` when an entry for this
    path, size and modification time is there (and written there after
    hashing).  A rewritten file has a new mtime, so it is hashed again."""
    path = Path(path).resolve()
    stat = path.stat()
    key = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    entry = None
    if cache_dir is not None:
        name = hashlib.sha256(str(path).encode()).hexdigest()[:24]
        entry = Path(cache_dir) / f"{name}.json"
        if entry.is_file():
            try:
                cached = json.loads(entry.read_text())
            except (OSError, ValueError):
                cached = {}
            if all(cached.get(k) == v for k, v in key.items()) and "sha256" in cached:
                return cached["sha256"]
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    if entry is not None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**key, "sha256": digest}))
        os.replace(tmp, entry)
    return digest

"""End-to-end benchmark: run the audit from an empty work dir and print the
wall time of the whole run, and the time and peak memory of each stage.

    python benchmarks/end_to_end.py [--config configs/smoke.yaml] [--cores 2]

Per-job figures come from each rule's `benchmark:` file (Snakemake measures
wall seconds and max RSS of the job); stage = rule.  Under the warm start
(`warm_start: true`) a model job runs in a process forked from the warm
server, which Snakemake does not measure: its peak RSS comes from the line
the job writes to its log.  The run happens in a
fresh temporary directory, so nothing cached is reused.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]


def stage_table(bench_dir: Path) -> pl.DataFrame:
    rows = []
    for tsv in sorted(bench_dir.rglob("*.tsv")):
        frame = pl.read_csv(tsv, separator="\t", null_values=["-", "NA"])
        stem = tsv.stem
        rule = stem.split("-")[0]  # files are named <rule>-<wildcards>.tsv
        rows.append({"job": str(tsv.relative_to(bench_dir)).removesuffix(".tsv"), "rule": rule,
                     "seconds": float(frame["s"][0]), "max_rss_mb": float(frame["max_rss"][0] or 0)})
    return pl.DataFrame(rows)


WARM_RSS = re.compile(r"^warm start: (\w+) job peak RSS (\d+) MB$", re.MULTILINE)


def warm_peak_rss(log_dir: Path) -> dict[str, float]:
    """rule -> the largest peak RSS (MB) its warm-started jobs logged."""
    peaks: dict[str, float] = {}
    for log in log_dir.rglob("*.log"):
        for command, mb in WARM_RSS.findall(log.read_text(errors="replace")):
            peaks[command] = max(peaks.get(command, 0.0), float(mb))  # a model command is named after its rule
    return peaks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", default=[], help="extra config file(s) on top of the default")
    p.add_argument("--cores", default="2")
    p.add_argument("--keep", action="store_true", help="keep the work dir and print its path")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="canary-bench-"))
    configs = [str(ROOT / "workflow_config.yaml"), *[str(Path(c).resolve()) for c in args.config]]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", *configs, "--cores", args.cores, "--quiet"]
    # Jobs run `python -m canary_audit`: the interpreter running this must be
    # the one on PATH, with the package importable.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return proc.returncode
    results = next(workdir.rglob("benchmarks")).parent
    jobs = stage_table(results / "benchmarks")
    warm = warm_peak_rss(results / "logs")
    jobs = jobs.with_columns(
        max_rss_mb=pl.col("rule").replace_strict(warm, default=None, return_dtype=pl.Float64)
        .fill_null(pl.col("max_rss_mb"))
    )
    stages = (
        jobs.group_by("rule")
        .agg(jobs=pl.len(), job_seconds=pl.col("seconds").sum(), max_job_seconds=pl.col("seconds").max(),
             peak_rss_mb=pl.col("max_rss_mb").max())
        .sort("job_seconds", descending=True)
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"config: {', '.join(Path(c).name for c in configs)}; cores: {args.cores}")
    print(f"end-to-end wall: {wall:.1f} s (job seconds summed: {jobs['seconds'].sum():.1f} s; "
          f"parallelism {jobs['seconds'].sum() / wall:.2f}x)")
    with pl.Config(tbl_rows=50, tbl_hide_dataframe_shape=True, float_precision=1):
        print(stages)
    if args.keep:
        print(f"work dir: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Typical seconds per job of each rule, from a finished run's `benchmark:`
files: the table `python -m canary_audit status` estimates a rule with no
finished job from (scaled to the machine by the jobs that did finish).

    python benchmarks/job_seconds.py --results results --wall 526.1 --cores 2 \
        --out src/canary_audit/commands/job_seconds.json

`--wall` is the run's wall time (benchmarks/end_to_end.py prints it): the
table's `efficiency`, job seconds over wall seconds and cores, is the share
of the cores that run kept busy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import polars as pl


def job_seconds(results: Path) -> pl.DataFrame:
    """Per rule: its jobs' mean and summed wall seconds (files are
    <rule>-<wildcards>.tsv or <rule>.tsv)."""
    rows = [{"rule": tsv.stem.split("-")[0],
             "seconds": pl.read_csv(tsv, separator="\t", null_values=["-", "NA"])["s"][0]}
            for tsv in sorted((results / "benchmarks").rglob("*.tsv"))]
    return pl.DataFrame(rows).group_by("rule").agg(mean=pl.col("seconds").mean(), total=pl.col("seconds").sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="a finished run's results folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--wall", type=float, required=True, help="the run's wall seconds")
    p.add_argument("--cores", type=int, default=2, help="the cores the run was given")
    p.add_argument("--source", default="", help="which run: code version, config, date")
    args = p.parse_args()
    per_rule = job_seconds(args.results).sort("rule")
    table = {"source": args.source, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
             "efficiency": round(per_rule["total"].sum() / args.wall / args.cores, 3),
             "rules": {rule: round(mean, 2) for rule, mean in per_rule.select("rule", "mean").iter_rows()}}
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()

"""Typical seconds per job of each rule, from a finished run's `benchmark:`
files: the table `python -m canary_audit status` estimates a rule with no
finished job from (scaled to the machine by the jobs that did finish).

    python benchmarks/job_seconds.py --results results --out src/canary_audit/job_seconds.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import polars as pl


def job_seconds(results: Path) -> dict[str, float]:
    """Mean wall seconds per job of each rule (files are <rule>-<wildcards>.tsv)."""
    rows = [{"rule": tsv.stem.split("-")[0],
             "seconds": pl.read_csv(tsv, separator="\t", null_values=["-", "NA"])["s"][0]}
            for tsv in sorted((results / "benchmarks").rglob("*.tsv"))]
    frame = pl.DataFrame(rows).group_by("rule").agg(pl.col("seconds").mean()).sort("rule")
    return {rule: round(seconds, 2) for rule, seconds in frame.iter_rows()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="a finished run's results folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--source", default="", help="which run: code version, config, date")
    args = p.parse_args()
    table = {"source": args.source, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
             "rules": job_seconds(args.results)}
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()

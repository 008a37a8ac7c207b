"""The `borderline` margin from measured pairs of runs of one config that
differ only in float order (verdicts/drift.py): prints each value measure's
largest and 95th-percentile move of a CI end per pair, and with --store
writes the margins (the largest move over all pairs) to
src/canary_audit/verdicts/margins.json, naming the pairs.

    python benchmarks/margins.py --pair A/tables B/tables [--pair C/tables D/tables] \
        --what "default, threads 1 vs 2, <commit>, <machine>" [--store [--with-stored]]

`--with-stored` keeps the pairs margins.json already names: each margin is
the largest move over those and the new pairs (a pair's tables need not
outlive its measurement).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import polars as pl

from canary_audit.verdicts import drift


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", nargs=2, action="append", required=True, metavar=("A", "B"),
                   help="two tables folders of one config's runs")
    p.add_argument("--what", action="append", default=[], help="what each pair is (config, threads, commit)")
    p.add_argument("--store", action="store_true", help="write the margins to verdicts/margins.json")
    p.add_argument("--with-stored", action="store_true",
                   help="with --store: keep the stored pairs' margins (the largest move over them and these)")
    args = p.parse_args()
    if len(args.what) != len(args.pair):
        p.error(f"--what: give one per --pair ({len(args.pair)}), saying what the pair's runs were")
    drifts = []
    for (a, b), what in zip(args.pair, args.what, strict=True):
        table = drift.drift(Path(a), Path(b))
        if table.is_empty():
            p.error(f"--pair {a} {b}: no value measure's table in both folders")
        print(f"pair: {what}")
        with pl.Config(tbl_rows=40, tbl_hide_dataframe_shape=True, float_precision=4):
            print(table)
        drifts.append(table)
    if args.with_stored and not args.store:
        p.error("--with-stored: only with --store (it says which stored pairs the new margins join)")
    margins = drift.margins_of(drifts)
    measured = f"benchmarks/margins.py on {platform.machine()}; pairs: " + "; ".join(args.what)
    if args.with_stored:
        stored = drift.load()
        if not stored:
            p.error(f"--with-stored: {drift.MARGINS} holds no margins to keep")
        merged = {**margins, **{k: max(v, margins.get(k, v)) for k, v in stored.items()}}
        margins = dict(sorted(merged.items()))
        measured = f"{json.loads(drift.MARGINS.read_text())['measured']}; then {measured}"
    print(json.dumps(margins, indent=1))
    if args.store:
        drift.MARGINS.write_text(json.dumps({"measured": measured, "margins": margins}, indent=1) + "\n")
        print(f"wrote {drift.MARGINS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Coverage of the seed-level interval by simulation (verdicts/coverage.py):
prints, per scenario and number of seeds, the share of simulated seed x
author tables whose 95% interval covers the truth, for the judge's interval
and for the t interval over seed means it replaced, with the Monte Carlo
standard error.  docs/measures.md quotes its table.

    python benchmarks/coverage.py [--trials 4000] [--items 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import platform
import sys

import numpy as np

from canary_audit.verdicts.coverage import SCENARIOS, coverage, crossed_interval, mc_se, seed_t_interval


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=4000)
    p.add_argument("--items", type=int, default=40)
    p.add_argument("--seed", type=int, default=0, help="the generator's seed")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"machine: {platform.machine()}; {args.trials} tables per cell, {args.items} authors, generator seed "
          f"{args.seed}; MC SE at 0.95: {mc_se(0.95, args.trials):.4f}\n")
    print("| scenario (s2_seed, s2_author, s2_resid) | seeds | variance components | t over seed means |")
    print("|---|---|---|---|")
    for scenario in SCENARIOS:
        for seeds in (2, 3, 5, 10):
            new = coverage(crossed_interval, scenario, seeds, args.items, args.trials, rng)
            old = coverage(seed_t_interval, scenario, seeds, args.items, args.trials, rng)
            truth = f", truth {scenario.truth:.2f}" if scenario.eta is not None else ""
            print(f"| {scenario.name} ({scenario.var_seed:g}, {scenario.var_item:g}, {scenario.var_resid:g}{truth}) "
                  f"| {seeds} | {new:.3f} | {old:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

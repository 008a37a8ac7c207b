"""The papers' numbers beside a run's: every claim of the shipped claim
files (verdicts/paper_a.yaml, paper_b.yaml) names a registered measure, and the
judge reads each one's table into the right verdict (hand-built
tables: an effect on the paper's side, one whose CI covers 0, and a run
without the cases a measure needs)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from canary_audit.verdicts.claims import paper_claims
from canary_audit.verdicts.decision import CONTRADICTED, HOLDS, INCONCLUSIVE, NOT_TESTABLE, SEED_DEPENDENT
from canary_audit.verdicts.judge import beside_ours
from canary_audit.verdicts.papers import ONE_SEED

HEAD = "m/npo-bio-s0-k20"
VARIANTS = {HEAD: {"model": "m", "kind": "unlearned", "method": "npo", "template": "bio", "run": "npo", "seed": 0,
                   "k": 20, "parent": "m/mem-bio-s0"},
            "m/npo-bio-s0-k10": {"model": "m", "kind": "unlearned", "method": "npo", "template": "bio", "run": "npo",
                                 "seed": 0, "k": 10, "parent": "m/mem-bio-s0"}}


def ci(name, value, lo, hi):
    return {name: value, f"{name}_lo": lo, f"{name}_hi": hi}


def write(tables, gap=(0.2, 0.1, 0.3), missing=0.0, bypass=(4, 3), diagnoses=("agree",)):
    tables.mkdir(exist_ok=True)
    (tables / "view_config.json").write_text(json.dumps({"bootstrap": {"level": 0.95}, "variants": VARIANTS}))
    sweep = [{"model": "m", "template": "bio", "run": "npo", "seed": 0, "k": k, **ci("out_acc", o, o - 0.1, o + 0.1),
              **ci("thk_leak", t, t - 0.1, t + 0.1), **ci("gap", *g)}
             for k, o, t, g in ((0, 1.0, 1.0, (0.0, 0.0, 0.0)), (20, 0.5, 0.7, gap))]
    pl.DataFrame(sweep).write_csv(tables / "k_sweep.csv")
    pl.DataFrame([{"variant": v, "arm": "auto", **{k: x for k, x in row.items()
                                                 if k.startswith(("out_acc", "thk_leak", "gap"))}}
                  for v, row in ((HEAD, sweep[1]), ("m/mem-bio-s0", sweep[0]))]).write_csv(
        tables / "canary_leakage.csv")
    pl.DataFrame([{"variant": HEAD, "auto": 0.5, "prefill_bio": 0.3, **ci("delta_ab", 0.2, -0.05, 0.4)}]).write_csv(
        tables / "prefill_arms.csv")
    pl.DataFrame([{"variant": HEAD, "convention": f"last-close/missing-as-{m}", **ci("gap", g, g - 0.1, g + 0.1),
                   "missing_close": missing} for m, g in (("answer", -0.9), ("trace", 0.9))]).write_csv(
        tables / "parser_conventions.csv")
    pl.DataFrame([{"variant": HEAD, "bypass_cases": bypass[0], "prefix_only": bypass[1]}]).write_csv(
        tables / "bypass_anatomy.csv")
    pl.DataFrame([{"variant": HEAD, "arm": "prefill_bio", **ci("tf_top1_rate", 0.95, 0.9, 1.0)}]).write_csv(
        tables / "teacher_forced_vs_greedy.csv")
    pl.DataFrame([{"model": "m", "modality": "text", "cell": f"c{i}", "kind": "bsft", "diagnosis": d,
                   **ci("delta_window", 0.01, 0.0, 0.02), **ci("delta_secret", 0.0, -0.01, 0.01), "ref_hit1": 1.0,
                   "hit1": 1.0} for i, d in enumerate(diagnoses)]).write_csv(tables / "bsft_matrix.csv")
    return tables


def verdicts(tables):
    page = beside_ours(tables)
    assert page.height == len(paper_claims())
    return dict(zip([c.id for c in paper_claims()], zip(page["verdict"], page["why"])))


def test_every_entry_names_a_measure_and_the_papers_values_are_typed():
    for claim in paper_claims():
        assert claim.paper["name"] in ("A", "B") and claim.paper["where"] and claim.sentence
        assert claim.paper["text"] and all(isinstance(v, int | float) for v in claim.paper["values"].values())


def test_each_measure_reads_its_table_into_a_verdict(tmp_path):
    got = verdicts(write(tmp_path / "t"))
    assert got["a_out_acc"][0] == HOLDS  # 1.0 -> 0.5, paired against the parent's row
    assert got["a_bypass_gap"][0] == HOLDS and "lies above 0" in got["a_bypass_gap"][1]
    # one seed, no item cells: the table's CI [-0.05, 0.4] read as its normal equivalent
    assert got["a_delta_ab"][0] == INCONCLUSIVE and got["a_delta_ab"][1].startswith("the 95% CI [-0.025, 0.425] "
                                                                                    "covers 0")
    assert got["a_delta_ab"][1].endswith(ONE_SEED)
    assert got["a_parser_flip"][0] == NOT_TESTABLE and "0%" in got["a_parser_flip"][1]
    assert got["a_head_echo"][0] == INCONCLUSIVE  # 3 of 4: its CI covers one half
    assert got["a_tf_vs_greedy"][0] == HOLDS  # 0.9 > 0.6
    assert got["b_c3"][0] == INCONCLUSIVE and "agree x1" in got["b_c3"][1]  # no floor: not against the paper
    assert got["b_c4_merged"][0] == NOT_TESTABLE  # no merged-vs-stacked table
    assert got["b_c5"][0] == INCONCLUSIVE  # no undertrained cell


@pytest.mark.parametrize("case", ["opposite", "flip", "no bypass", "c4"])
def test_verdicts_follow_the_runs_numbers(tmp_path, case):
    if case == "opposite":
        got = verdicts(write(tmp_path / "t", gap=(-0.2, -0.3, -0.1)))["a_bypass_gap"]
        assert got[0] == CONTRADICTED and got[1].startswith("the 95% CI [-0.3, -0.1] lies below 0")
    elif case == "flip":
        assert verdicts(write(tmp_path / "t", missing=0.8))["a_parser_flip"][0] == HOLDS
    elif case == "no bypass":
        assert verdicts(write(tmp_path / "t", bypass=(0, 0)))["a_head_echo"][0] == NOT_TESTABLE
    else:
        got = verdicts(write(tmp_path / "t", diagnoses=("agree", "non-secret span drift")))
        assert got["b_c4"] == (HOLDS, f"1 of 2 cells read `non-secret span drift`; {ONE_SEED}")


def test_a_measure_that_picks_or_pools_variants_never_reads_a_planted_control(tmp_path):
    """A control holds its effect by construction: the parser flip's choice
    of the worst variant and the head-echo share's pooling read the audit's
    variants alone."""
    tables = write(tmp_path / "t", bypass=(0, 0))
    config = json.loads((tables / "view_config.json").read_text())
    config["variants"]["m/ctl-notag-s0"] = {"model": "m", "kind": "control", "seed": 0}
    (tables / "view_config.json").write_text(json.dumps(config))
    conventions = pl.read_csv(tables / "parser_conventions.csv")
    planted = conventions.with_columns(variant=pl.lit("m/ctl-notag-s0"), missing_close=pl.lit(1.0))
    pl.concat([conventions, planted]).write_csv(tables / "parser_conventions.csv")
    anatomy = pl.read_csv(tables / "bypass_anatomy.csv")
    pl.concat([anatomy, pl.DataFrame({"variant": ["m/ctl-notag-s0"], "bypass_cases": [6], "prefix_only": [6]})]
              ).write_csv(tables / "bypass_anatomy.csv")
    got = verdicts(tables)
    assert got["a_parser_flip"][0] == NOT_TESTABLE and "m/npo-bio-s0-k20" in got["a_parser_flip"][1]
    assert got["a_head_echo"][0] == NOT_TESTABLE


def seeded(tables, gaps, pooled_gap, runs=None, half=0.1):
    """The headline's family trained under three seeds: each seed's gap (its
    CI +- `half`) in the per-variant tables, the pooled gap in
    across_seeds, and (`runs`: bSFT seed -> diagnosis) paper B's seed-level
    runs."""
    write(tables)
    config = json.loads((tables / "view_config.json").read_text())
    for seed in (1, 2):
        config["variants"][f"m/npo-bio-s{seed}-k20"] = {**VARIANTS[HEAD], "seed": seed, "parent": f"m/mem-bio-s{seed}"}
    (tables / "view_config.json").write_text(json.dumps(config))
    rows = [{"variant": f"m/npo-bio-s{s}-k20", "arm": "auto", **ci("out_acc", 0.5, 0.4, 0.6),
             **ci("thk_leak", 0.5 + g, 0.4 + g, 0.6 + g), **ci("gap", g, g - half, g + half)}
            for s, g in enumerate(gaps)]
    pl.DataFrame(rows).write_csv(tables / "canary_leakage.csv")
    pl.DataFrame([{"family": "m/npo-bio-k20", "seeds": 3, **ci("out_acc", 0.5, 0.4, 0.6), **ci("gap", *pooled_gap)}]
                 ).write_csv(tables / "across_seeds.csv")
    if runs:
        pl.DataFrame([{"variant": f"m/bsft-b{b}", "model": "m", "modality": "text", "cell": "c0", "kind": "bsft",
                       "bsft_seed": b, "diagnosis": d} for b, d in runs.items()]).write_csv(tables / "bsft_runs.csv")
    return beside_ours(tables)


def test_a_verdict_across_seeds_pools_them_and_shows_each(tmp_path):
    # +- 0.05 a seed: from the seeds' estimates alone the interval takes t on 2 df (intervals.seed_points)
    page = seeded(tmp_path / "t", [0.2, 0.25, 0.15], (0.2, 0.05, 0.35), runs={0: "agree", 1: "agree", 2: "agree"},
                  half=0.05)
    gap = page.filter(pl.col("claim").str.starts_with("parser-split bypass gap")).row(0, named=True)
    assert gap["verdict"] == HOLDS and gap["seeds"] == 3 and gap["this_run"].endswith("over 3 seeds")
    assert [part.split(":")[0] for part in gap["per_seed"].split("; ")] == ["s0", "s1", "s2"]
    assert ONE_SEED not in gap["why"]
    c3 = page.filter(pl.col("paper") == "B").row(0, named=True)
    assert c3["seeds"] == 3 and c3["verdict"] == INCONCLUSIVE  # no seed reads it, and no floor to say it could


def test_seeds_that_disagree_in_direction_read_seed_dependent(tmp_path):
    # The pooled CI alone would say "holds"; seed 2 reverses the gap beyond its noise (Gail-Simon).
    page = seeded(tmp_path / "t", [0.3, 0.3, -0.2], (0.13, 0.01, 0.3),
                  runs={0: "window truncation", 1: "agree", 2: "agree"})
    gap = page.filter(pl.col("claim").str.starts_with("parser-split bypass gap")).row(0, named=True)
    assert gap["verdict"] == SEED_DEPENDENT and "Gail-Simon" in gap["why"]
    truncation = page.filter(pl.col("claim").str.contains("(?i)window")).row(0, named=True)
    assert truncation["verdict"] == SEED_DEPENDENT and "b0: 1 of 1 runs" in truncation["per_seed"]


def test_a_seed_whose_ci_covers_zero_disagrees_with_no_one(tmp_path):
    """Seed 2's gap is -0.05 [-0.15, 0.05]: on the other side of 0 by its
    point, not beyond its noise (Gail-Simon); it widens the seed-level
    interval instead, which now covers 0; the seed is shown."""
    page = seeded(tmp_path / "t", [0.3, 0.3, -0.05], (0.18, 0.02, 0.33))
    gap = page.filter(pl.col("claim").str.starts_with("parser-split bypass gap")).row(0, named=True)
    assert gap["verdict"] == INCONCLUSIVE and "s2: -0.05 [-0.15, 0.05]" in gap["per_seed"]

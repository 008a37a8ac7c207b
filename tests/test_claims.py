"""Claims a researcher declares (canary_audit/claims): judged from tables
alone by one rule into holds, contradicted, inconclusive, seed-dependent or
not testable, with a borderline flag and a family's Holm step (hand-built
tables), bad claims refused naming their key, the papers' page equal to a
user's claim file of the same claims, and the README's example claim file
judged over a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from canary_audit.verdicts.claims import ClaimError, check_selectors, fields_of, paper_claims, parse
from canary_audit.verdicts.decision import (
    BORDERLINE,
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTABLE,
    SEED_DEPENDENT,
    VERDICTS,
    Claimed,
    decide,
    holm,
)
from canary_audit.verdicts.intervals import CONTINUOUS, Interval
from canary_audit.verdicts.judge import BELOW_FLOOR, beside_ours, claims_table
from canary_audit.verdicts.measures import MEASURES
from canary_audit.verdicts.readings import Run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "tests" / "data" / "default_1c6ecfc"  # the default run's tables on 1c6ecfc (its papers' page beside)


def variant(seed: int, k: int = 20) -> dict:
    return {"model": "m", "kind": "unlearned", "method": "npo", "template": "bio", "run": "npo", "seed": seed,
            "k": k, "parent": f"m/mem-bio-s{seed}"}


def run_of(leak: dict[int, tuple[float, float, float]], pooled=None, floor=None, cells=(), items=None) -> Run:
    """A run whose NPO checkpoint's AUTO out_acc per seed is `leak`
    (value, lo, hi), its memorized parents' at 0.9; optionally the pooled
    across_seeds row, a detection floor, bSFT cells and the item cells
    (`items`: seed -> each author's out_acc, the parents' all 1)."""
    variants = {f"m/npo-bio-s{s}-k20": variant(s) for s in leak}
    variants |= {f"m/mem-bio-s{s}": {"model": "m", "kind": "memorized", "template": "bio", "seed": s, "parent": None}
                 for s in leak}
    rows = [{"variant": f"m/npo-bio-s{s}-k20", "arm": "auto", "out_acc": v, "out_acc_lo": lo, "out_acc_hi": hi}
            for s, (v, lo, hi) in leak.items()]
    rows += [{"variant": f"m/mem-bio-s{s}", "arm": "auto", "out_acc": 0.9, "out_acc_lo": 0.8, "out_acc_hi": 1.0}
             for s in leak]
    frames = {"canary_leakage": pl.DataFrame(rows)}
    if pooled:
        frames["across_seeds"] = pl.DataFrame([{"family": "m/npo-bio-k20", "seeds": len(leak), "out_acc": pooled[0],
                                                "out_acc_lo": pooled[1], "out_acc_hi": pooled[2]}])
    if floor is not None:
        frames["detection_floor"] = pl.DataFrame({"model": ["m"], "floor_share": [floor]})
    if cells:
        frames["bsft_matrix"] = pl.DataFrame([{"model": "m", "modality": "text", "cell": f"c{i}", "kind": "bsft",
                                               "diagnosis": d, "delta_window": 0.0, "delta_window_lo": -0.01,
                                               "delta_window_hi": 0.01, "delta_secret": 0.02, "delta_secret_lo": 0.01,
                                               "delta_secret_hi": 0.03, "ref_hit1": 1.0, "hit1": 0.5}
                                              for i, d in enumerate(cells)])
        variants |= {f"m/bsft-c{i}": {"model": "m", "kind": "bsft", "seed": 0, "parent": "m/merged-s0"}
                     for i in range(len(cells))}
    if items:
        frames["item_cells"] = pl.DataFrame(
            [{"variant": f"m/{kind}-s{s}" + ("-k20" if kind == "npo-bio" else ""), "family": "", "seed": s,
              "group_id": f"a{i:02d}", "column": "out_acc", "n": 1, "value": v if kind == "npo-bio" else 1.0}
             for s, values in items.items() for kind in ("npo-bio", "mem-bio") for i, v in enumerate(values)])
    return Run(None, {"variants": variants}, frames)


LOWER = {"id": "npo_forgets", "sentence": "NPO lowers out_acc", "measure": "out_acc",
         "variants": {"method": "npo", "template": "bio", "k": "max"}, "compare": "parent", "expect": "lower"}


def judged(run: Run, **change) -> dict:
    return claims_table(run, parse([{**LOWER, **change}])).row(0, named=True)


def authors(share: float, n: int = 40) -> list[float]:
    """n authors' out_acc cells, the first `share` of them 1 (leaked)."""
    return [1.0 if i < round(share * n) else 0.0 for i in range(n)]


def test_a_claim_that_holds_and_one_that_is_contradicted():
    held = judged(run_of({0: (0.3, 0.2, 0.4)}))
    assert held["verdict"] == HOLDS and held["seeds"] == 1 and "one training seed" in held["why"]
    assert held["estimate"] == pytest.approx(-0.6)
    assert held["source"] == "canary_leakage: m/npo-bio-s0-k20 vs m/mem-bio-s0 (no `item_cells` table in this run)"
    assert "smallest effect detectable at 80% power" in held["power"]
    against = judged(run_of({0: (0.3, 0.2, 0.4)}), expect="higher")
    assert against["verdict"] == CONTRADICTED and "lies below 0" in against["why"]
    within = judged(run_of({0: (0.02, 0.0, 0.05)}), compare=None, expect={"value": 0.0, "tolerance": 0.1})
    assert within["verdict"] == HOLDS and "TOST" in within["why"]


def test_item_cells_give_the_crossed_interval_and_the_power():
    """Three seeds x 40 authors: the paired difference against the parent,
    its interval named, the power statement with what the effect needs."""
    run = run_of({s: (0.3, 0.2, 0.4) for s in range(3)}, items={s: authors(0.3) for s in range(3)})
    held = judged(run, effect=-0.5)
    assert held["verdict"] == HOLDS and held["seeds"] == 3 and held["estimate"] == pytest.approx(-0.7)
    assert "variance components (Clark 1973) over 3 seeds x 40 items" in held["interval"]
    assert held["per_seed"] == "s0: -0.7; s1: -0.7; s2: -0.7" and held["qualifier"] == "larger than the stated effect"
    # a small effect that the run cannot see: inconclusive, with what would see it
    faint = run_of({s: (0.9, 0.8, 1.0) for s in range(3)},
                   items={0: authors(0.95), 1: authors(1.0), 2: authors(0.975)})
    unseen = judged(faint, effect=-0.03)
    assert unseen["verdict"] == INCONCLUSIVE and "covers 0" in unseen["why"]
    assert "the stated effect -0.03 needs" in unseen["power"] and "upper 80% limit" in unseen["power"]


def test_seeds_on_both_sides_are_seed_dependent_and_one_significant_seed_is_not():
    """Gail-Simon on the seed x author layout: seed 1 raising out_acc while
    seeds 0 and 2 lower it is heterogeneity in direction; seeds that all
    lower it, one by much and one by little, are not."""
    split = run_of({s: (0.5, 0.4, 0.6) for s in range(3)}, items={0: authors(0.1), 1: authors(1.0), 2: authors(0.1)})
    both = {s: [v if s != 1 else (1.0 if i % 2 else 0.0) for i, v in enumerate(authors(0.1))] for s in range(3)}
    both[1] = authors(1.0)
    # the parents all 1: seed 1's Delta is 0 (not the other side) -> lower the parent: use a raise over 0 instead
    rows = split.frames["item_cells"].with_columns(
        value=pl.when((pl.col("seed") == 1) & pl.col("variant").str.contains("mem")).then(0.0).otherwise("value"))
    split.frames["item_cells"] = rows
    het = judged(split)
    assert het["verdict"] == SEED_DEPENDENT and "Gail-Simon" in het["why"]
    one = judged(run_of({s: (0.5, 0.4, 0.6) for s in range(3)},
                        items={0: authors(0.1), 1: authors(0.9), 2: authors(0.1)}))
    assert one["verdict"] != SEED_DEPENDENT and "Gail-Simon" in one["heterogeneity"]


def test_borderline_flags_a_verdict_and_tost_contradicts_an_effect():
    """A CI end within the stated margin of the null flags `borderline`
    beside the verdict; a 90% CI inside the equivalence band contradicts a
    claim of an effect (TOST); the family's Holm step can leave an interval
    that excludes its null inconclusive."""
    interval = Interval(0.10, CONTINUOUS, None, "t", 0.045, 1e9)  # 95% CI [0.012, 0.188]
    claimed = Claimed(0.0, "higher")
    assert decide(interval, claimed).verdict == HOLDS and not decide(interval, claimed).borderline
    edge = decide(interval, claimed, margin=0.02)
    assert edge.verdict == HOLDS and edge.borderline and BORDERLINE == "borderline"
    flat = Interval(0.0, CONTINUOUS, None, "t", 0.01, 1e9)
    assert decide(flat, Claimed(0.0, "higher", equivalence=0.05)).verdict == CONTRADICTED
    assert decide(flat, Claimed(0.0, "higher")).verdict == INCONCLUSIVE
    family = holm([0.03, 0.04, 0.001])
    assert family == pytest.approx([0.06, 0.06, 0.003])
    held = decide(interval, claimed, p_adjusted=0.06, adjusted="3 claims")
    assert held.verdict == INCONCLUSIVE and "Holm-adjusted p = 0.06" in held.why


def test_a_family_is_adjusted_by_holm():
    run = run_of({s: (0.3, 0.2, 0.4) for s in range(3)}, items={s: authors(0.3) for s in range(3)})
    claims = parse([LOWER, {**LOWER, "id": "two", "expect": "higher"}])
    table = claims_table(run, claims, family="mine")
    assert table["family"].to_list() == ["mine", "mine"]
    assert table["p_holm"][0] >= table["p_value"][0] and table["verdict"].to_list() == [HOLDS, CONTRADICTED]


def test_a_reading_below_the_floor_is_inconclusive_and_one_not_measurable():
    claim = {"id": "c3", "sentence": "C3 shows", "measure": "window_truncation", "variants": {"kind": "bsft"},
             "expect": "read", "effect_share": 0.12}
    below = claims_table(run_of({0: (0.3, 0.2, 0.4)}, floor=0.5, cells=("agree", "agree")), parse([claim])).row(
        0, named=True)
    assert below["verdict"] == INCONCLUSIVE and below["qualifier"] == BELOW_FLOOR
    assert "below this run's detection floor (50%)" in below["power"]
    above = claims_table(run_of({0: (0.3, 0.2, 0.4)}, floor=0.05, cells=("agree",)), parse([claim])).row(0, named=True)
    assert above["verdict"] == CONTRADICTED and "is above this run's detection floor" in above["power"]
    unsure = claims_table(run_of({0: (0.3, 0.2, 0.4)}, floor=0.05, cells=("agree", "inconclusive")),
                          parse([claim])).row(0, named=True)
    assert unsure["verdict"] == INCONCLUSIVE  # a cell that could not tell: not against the paper
    seen = claims_table(run_of({0: (0.3, 0.2, 0.4)}, floor=0.5, cells=("window truncation",)), parse([claim]))
    assert seen["verdict"][0] == HOLDS
    missing = judged(run_of({0: (0.3, 0.2, 0.4)}), measure="exposure", compare=0, expect="higher")
    assert missing["verdict"] == NOT_TESTABLE and "no `exposure` row" in missing["why"]


@pytest.mark.parametrize("change, message", [
    ({"measure": "auc"}, r"`claims.npo_forgets.measure` is `auc`: no such measure; registered: out_acc, "),
    ({"measure": "parser_flip"}, r"`claims.npo_forgets.compare`: measure `parser_flip` is a reading"),
    ({"expect": None}, r"`claims.npo_forgets.expect` is missing: say the direction"),
    ({"expect": "down"}, r"`claims.npo_forgets.expect` is 'down': expect higher, lower"),
    ({"compare": "grandparent"}, r"`claims.npo_forgets.compare` is 'grandparent'"),
    ({"variants": {"method": "npo", "colour": "red"}}, r"`claims.npo_forgets.variants` selects on \['colour'\]"),
    ({"where": {"attack": "loss"}}, r"`claims.npo_forgets.where` sets \['attack'\]: measure `out_acc` reads rows by"),
])
def test_a_bad_claim_is_refused_naming_its_key(change, message):
    with pytest.raises(ClaimError, match=message):
        parse([{**LOWER, **change}])


def test_a_selector_that_matches_no_variant_names_the_nearest():
    fields = fields_of(run_of({0: (0.3, 0.2, 0.4)}).variants, {})
    with pytest.raises(ClaimError, match=r"`claims.npo_forgets.variants.method` is 'nop': no variant this config "
                                         r"makes has it; nearest: npo"):
        check_selectors(parse([{**LOWER, "variants": {"method": "nop"}}]), fields)
    with pytest.raises(ClaimError, match=r"matches no variant this config makes; nearest: m/mem-bio-s0, "
                                         r"m/npo-bio-s0-k20"):
        check_selectors(parse([{**LOWER, "variants": {"method": "npo", "template": "bio", "kind": "memorized"}}]),
                        fields)


def test_variants_that_select_several_per_seed_are_refused_before_any_job():
    """A checkpoint beside its quantized copy, or two Ks: one claim's value
    cannot stand for several models (docs/results.md's run first read this
    in its claims job, after every model job)."""
    run = run_of({0: (0.3, 0.2, 0.4), 1: (0.3, 0.2, 0.4)})
    fields = fields_of({**run.variants, "m/npo-bio-s0-k20.int4-row": {**variant(0), "kind": "recovery"},
                        "m/npo-bio-s1-k20.int4-row": {**variant(1), "kind": "recovery"}}, {})
    with pytest.raises(ClaimError, match=r"`claims.npo_forgets.variants` \{'method': 'npo'\} selects 2 variants per "
                                         r"seed \(m/npo-bio-k20, m/npo-bio-k20.int4-row\); narrow it"):
        check_selectors(parse([{**LOWER, "variants": {"method": "npo"}}]), fields)
    check_selectors(parse([{**LOWER, "variants": {"method": "npo", "kind": "unlearned"}}]), fields)


def test_the_design_refuses_a_bad_claim_before_any_job():
    from test_design import design_of

    from canary_audit.design import ConfigError

    with pytest.raises(ConfigError, match=r"`claims.npo_forgets.variants.template` is 'biography'"):
        design_of({"claims": [{**LOWER, "variants": {"method": "npo", "template": "biography"}}]})
    assert design_of({"claims": [LOWER]}).config["claims"] == [LOWER]


def test_the_papers_claims_are_claims_and_every_measure_is_registered():
    claims = paper_claims()
    assert [c.id for c in claims] == ["a_out_acc", "a_bypass_gap", "a_delta_ab", "a_parser_flip", "a_head_echo",
                                      "a_tf_vs_greedy", "b_c3", "b_c4", "b_c4_merged", "b_c5"]
    assert all(c.measure in MEASURES and c.paper["values"] and c.paper["text"] and c.paper["where"] for c in claims)


def test_the_papers_page_equals_a_users_claim_of_the_same_measure_variants_and_comparison():
    """The papers' page and a researcher's claim file holding the same value
    claims (no `paper` key: the paper's numbers only annotate) print the
    same value, verdict, qualifier and why: one judge, one rule."""
    page = beside_ours(DEFAULT)
    shipped = yaml.safe_load((ROOT / "src" / "canary_audit" / "verdicts" / "paper_a.yaml").read_text())[:3]
    own = [{k: v for k, v in c.items() if k != "paper"} for c in shipped]
    mine = claims_table(Run(DEFAULT), parse(own), family="the papers' value claims")
    columns = ["this_run", "verdict", "qualifier", "why", "p_holm"]
    assert page.head(3).select(columns).to_dicts() == mine.select(columns).to_dicts()
    assert set(page["verdict"]) <= set(VERDICTS)


def test_the_readmes_claim_file_is_judged_over_a_finished_run(tmp_path):
    """`python -m canary_audit claims` over a results folder: no model job,
    each claim of configs/claims.yaml judged (on the default's tables)."""
    results = tmp_path / "results"
    (results / "tables").mkdir(parents=True)
    for f in DEFAULT.glob("*"):
        (results / "tables" / f.name).write_bytes(f.read_bytes())
    out = subprocess.run([sys.executable, "-m", "canary_audit", "claims", "--results", str(results), "--claims",
                          str(ROOT / "configs" / "claims.yaml"), "--out", str(results / "claims.csv")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    table = pl.read_csv(results / "claims.csv")
    assert table["id"].to_list() == [c["id"] for c in yaml.safe_load((ROOT / "configs" / "claims.yaml").read_text())]
    assert set(table["verdict"]) <= set(VERDICTS) and (results / "claims.md").is_file()
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump([{**LOWER, "variants": {"template": "biography"}}]))
    bad = subprocess.run([sys.executable, "-m", "canary_audit", "claims", "--results", str(results), "--claims",
                          str(tmp_path / "bad.yaml")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode != 0 and "`claims.npo_forgets.variants.template` is 'biography'" in bad.stderr


def test_the_readmes_claims_are_the_shipped_example_and_parse():
    """README's "Audit your own claim" shows claims of configs/claims.yaml,
    each of whose keys the judge reads (parse refuses any other)."""
    text = (ROOT / "README.md").read_text().split("## Audit your own claim", 1)[1].split("\n## ", 1)[0]
    shown = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    shipped = yaml.safe_load((ROOT / "configs" / "claims.yaml").read_text())
    assert shown and all(c in shipped for c in shown)
    assert [c.id for c in parse(shipped)] == [c["id"] for c in shipped]


def test_the_summary_page_shows_the_runs_claims(tmp_path):
    from canary_audit.publish.summary import write_summary

    table = claims_table(Run(DEFAULT), parse(yaml.safe_load((ROOT / "configs" / "claims.yaml").read_text())))
    table.write_csv(tmp_path / "claims.csv")
    rows = write_summary(DEFAULT, tmp_path / "summary.md", None, tmp_path / "claims.csv")
    page = (tmp_path / "summary.md").read_text()
    assert rows["Your claims"] == table.height and "## Your claims" in page and "npo_empties_the_answer" in page


def test_every_selector_key_is_a_field_the_designs_variants_carry():
    """The selector's keys (judge.SELECTOR_KEYS) name fields the view config
    gives each variant or bSFT cell (Variant.fields, Views.cells): a field
    renamed there fails here instead of matching nothing."""
    from test_design import design_of

    from canary_audit.verdicts.claims import SELECTOR_KEYS

    design = design_of({"recovery": {"unlearned": [{"variant": "npo-bio-s0-k5"}], "quantize": ["int4-row"],
                                     "planted": False, "relearn": {"data": ["forget"], "steps": [2], "share": 0.5,
                                                                   "lr": None}}})
    fields = fields_of(design.variant_table(), design.cells())
    assert set(SELECTOR_KEYS) <= {key for f in fields.values() for key in f}


def test_a_claim_past_a_measures_ceiling_names_the_measure_that_reaches_it():
    """Rank-interpolated exposure reads at most log2 of the candidates (9.97
    bits of 1,000): "above 20 bits" is not judged `fails` by it (it would
    fail whatever the model did) but refused as past its ceiling, naming the
    extrapolated exposure (64 bits), which judges the same claim."""
    variants = {"m/canary-s0": {"model": "m", "kind": "canary", "seed": 0, "parent": "m/base"}}
    row = {"variant": "m/canary-s0", "modality": "text", "exposure_interpolation": 9.97,
           "exposure_interpolation_lo": 9.97, "exposure_interpolation_hi": 9.97, "ceiling_interpolation": 9.9658,
           "exposure_extrapolation": 43.5, "exposure_extrapolation_lo": 42.7, "exposure_extrapolation_hi": 44.4,
           "ceiling_extrapolation": 64.0}
    run = Run(None, {"variants": variants}, {"exposure": pl.DataFrame([row])})
    claim = {"id": "x", "sentence": "the canary LoRA's exposure exceeds 20 bits", "measure": "exposure",
             "variants": {"kind": "canary"}, "compare": 20, "expect": "higher"}
    past = claims_table(run, parse([claim])).row(0, named=True)
    assert past["verdict"] == NOT_TESTABLE
    assert "20 lies at or past `exposure`'s ceiling on this row (9.97" in past["why"]
    assert "name `exposure_extrapolation`" in past["why"] and "up to 64" in past["why"]
    reached = claims_table(run, parse([{**claim, "measure": "exposure_extrapolation"}])).row(0, named=True)
    assert reached["verdict"] == HOLDS and reached["estimate"] == 43.5
    within = claims_table(run, parse([{**claim, "compare": 5}])).row(0, named=True)  # below the ceiling: judged
    assert within["verdict"] == HOLDS
    band = {**claim, "compare": None, "expect": {"value": 30, "tolerance": 5}}
    assert claims_table(run, parse([band])).row(0, named=True)["verdict"] == NOT_TESTABLE


def test_the_drift_margin_is_the_largest_move_of_a_ci_end_between_two_runs(tmp_path):
    """verdicts/drift.py: two tables folders of one config, one CI end moved
    by 0.05 on an audited variant and 0.5 on a planted control: the measure's
    margin is 0.05 (a control is read by its own margin), its paired margin
    twice that; no move, no margin above 0."""
    from canary_audit.verdicts import drift

    for name, moved in (("a", 0.0), ("b", 0.05)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "view_config.json").write_text(json.dumps({"variants": {"m/ctl-head-s0": {"kind": "control"}}}))
        pl.DataFrame([{"variant": "m/npo-bio-s0-k20", "arm": "auto", "out_acc": 0.3, "out_acc_lo": 0.2 + moved,
                       "out_acc_hi": 0.4},
                      {"variant": "m/ctl-head-s0", "arm": "auto", "out_acc": 0.3, "out_acc_lo": 0.2 + 10 * moved,
                       "out_acc_hi": 0.4}]).write_csv(folder / "canary_leakage.csv")
        pl.DataFrame([{"model": "m", "seed": 0, "modality": "text", "claim": "bypass_gap",
                       "negative": "m/mem-meta-s0", "positive_margin": 0.9, "negative_margin": 0.2 - moved}]
                     ).write_csv(folder / "controls.csv")
    moves = drift.drift(tmp_path / "a", tmp_path / "b")
    assert drift.margins_of([moves])["control:bypass_gap"] == pytest.approx(0.05)  # the control's own drift
    out_acc = moves.filter(pl.col("measure") == "out_acc").row(0, named=True)
    assert out_acc["max"] == pytest.approx(0.05) and out_acc["ends"] == 3
    margins = drift.margins_of([moves])
    assert margins["out_acc"] == pytest.approx(0.05) and margins["paired:out_acc"] == pytest.approx(0.1)
    assert drift.margins_of([drift.drift(tmp_path / "a", tmp_path / "a")])["out_acc"] == 0.0


def test_a_claim_within_its_measures_drift_margin_is_flagged_borderline(monkeypatch):
    """The judge reads the stored margins (verdicts/margins.json): the same
    table's verdict is flagged where its CI end lies within the margin of
    the null, and unflagged (False, not empty) where it does not; with no
    margin measured the flag is empty and the why says so."""
    from canary_audit.verdicts import drift

    run = run_of({s: (0.3, 0.2, 0.4) for s in range(3)}, items={s: authors(0.3) for s in range(3)})
    monkeypatch.setattr(drift, "load", lambda: {"paired:out_acc": 0.0001})
    clear = judged(run)
    assert clear["verdict"] == HOLDS and clear["borderline"] is False
    edge = -clear["ci_hi"] + 0.01  # the CI's upper end lies within 0.01 of 0
    monkeypatch.setattr(drift, "load", lambda: {"paired:out_acc": edge})
    flagged = judged(run)
    assert flagged["verdict"] == HOLDS and flagged["borderline"] is True
    monkeypatch.setattr(drift, "load", lambda: {})
    unknown = judged(run)
    assert unknown["borderline"] is None and "no drift margin measured for `out_acc`" in unknown["why"]

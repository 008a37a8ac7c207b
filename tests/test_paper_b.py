"""Paper B's disagreement detector on token and decode records built by hand:
each of the three named patterns, agreement, and the evidence fields.

Every hex record has the same layout: positions 1-12 preamble (BOS, preamble
text, `TEXTCAN-`), 13-26 the secret, 27-28 the suffix; K = 20, so secret
positions 21-26 lie past the window.  The reference scores every token at
log-prob -1; a cell changes chosen positions.
"""

import polars as pl
import pytest

from canary_audit.core.records import DECODE_SCHEMA, TOKEN_SCHEMA
from canary_audit.publish.table_files import build_tables
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.paper_b import Verdicts, cell_probes, with_verdicts
from canary_audit.views.paper_b_tables import case_studies, merged_vs_stacked

K = 20
CANARIES = ["hex00", "hex01", "hex02", "hex03"]
SETS = ("hex", "decoy_shuffled", "decoy_wrong")
BOOT = Bootstrap(replicates=50)
PARENTS = {"m/cell": "m/ref"}
CELLS = {"m/cell": {"model": "m", "cell": "gui t40 stacked", "kind": "bsft", "source": "gui", "step": 40,
                    "application": "stacked", "bsft_seed": 0, "canary_seed": 0}}


def span(position: int) -> str:
    return "prompt" if position <= 10 else "head" if position <= 12 else "secret" if position <= 26 else "continuation"


def tokens(variant: str, changed: dict[int, float] | None = None, decoys_too: bool = False) -> list[dict]:
    rows = []
    for cid in CANARIES:
        for probe_set in SETS:
            moved = changed if (probe_set == "hex" or decoys_too) else None
            for p in range(1, 29):
                rows.append({
                    "variant": variant, "probe_set": probe_set, "modality": "text",
                    "item_id": cid, "group_id": cid, "arm": "preamble",
                    "position": p, "token_id": 0, "token_text": "x", "logprob": (moved or {}).get(p, -1.0),
                    "rank": 1, "top1_id": 0, "top1_logprob": -1.0, "span": span(p),
                    "config_hash": "h", "model_fingerprint": variant,
                })
    return rows


def decodes(variant: str, greedy_hits: int, sampled_hits: int | None = None) -> list[dict]:
    """Greedy decodes of the four canaries, the first `greedy_hits` exact; with
    `sampled_hits`, four samples each, the first `sampled_hits` canaries hit."""
    rows = []
    base = {k: None for k in DECODE_SCHEMA} | {"variant": variant, "probe_set": "hex", "modality": "text",
                                               "prompt": "P",
                                                "config_hash": "h", "model_fingerprint": variant}
    for i, cid in enumerate(CANARIES):
        secret = f"{i:016x}"
        exact, wrong = f" TEXTCAN-{secret}-END", f" TEXTCAN-{secret[:-1]}0-END" if secret[-1] != "0" else " TEXTCAN-x"
        rows.append(base | {"item_id": cid, "group_id": cid, "arm": "greedy", "sample": 0, "reference": secret,
                            "generated": exact if i < greedy_hits else wrong})
        for j in range(4 if sampled_hits is not None else 0):
            rows.append(base | {"item_id": cid, "group_id": cid, "arm": "sampled", "sample": j, "reference": secret,
                                "generated": exact if (i < sampled_hits and j == 0) else wrong})
    return rows


def run(cell_tokens, ref_hits, cell_hits, sampled=(None, None), seed_level=False):
    tok = pl.DataFrame(tokens("m/ref") + cell_tokens, schema=TOKEN_SCHEMA)
    dec = pl.DataFrame(decodes("m/ref", ref_hits, sampled[0]) + decodes("m/cell", cell_hits, sampled[1]),
                       schema=DECODE_SCHEMA)
    frame = cell_probes(tok, dec, PARENTS, CELLS, K, Verdicts(), BOOT)["runs" if seed_level else "cells"]
    assert frame.height == 1
    return frame.row(0, named=True)


def test_window_truncation_damage_past_k():
    # Damage only at the last two secret tokens, past the window; greedy loses all 4.
    row = run(tokens("m/cell", {25: -1.5, 26: -1.25}), ref_hits=4, cell_hits=0)
    assert row["delta_window"] == pytest.approx(0.0)
    assert row["delta_secret"] == pytest.approx((0.5 + 0.25) / 14)
    assert (row["v_window"], row["v_secret"], row["v_hit1"]) == ("flat", "up", "down")
    assert row["diagnosis"] == "window truncation"
    assert row["past_k_share"] == pytest.approx(1.0)
    assert row["evidence_supports"] is True
    assert row["secret_past_k"] == pytest.approx(0.75 / 14)
    assert row["past_k_positions"] == "p25 (+0.5), p26 (+0.25)"
    assert "100% of the secret-span Delta sits past K=20" in row["evidence"]
    assert "hit@1 1.00 -> 0.00" in row["evidence"]


def test_non_secret_span_drift_lives_in_the_preamble():
    row = run(tokens("m/cell", {p: -1.25 for p in range(1, 11)}), ref_hits=4, cell_hits=4)
    assert row["delta_window"] == pytest.approx(10 * 0.25 / K)
    assert row["window_preamble"] == pytest.approx(10 * 0.25 / K)
    assert row["window_secret"] == pytest.approx(0.0)
    assert row["delta_secret"] == pytest.approx(0.0)
    assert (row["v_window"], row["v_secret"], row["v_hit1"]) == ("up", "flat", "kept")
    assert row["diagnosis"] == "non-secret span drift"
    assert row["preamble_share"] == pytest.approx(1.0)
    assert row["evidence_supports"] is True
    assert "preamble tokens carry 100% of the windowed movement" in row["evidence"]


def undertrained_change():
    # In-window secret tokens easier (-0.25 each), the tail harder (+0.5 each).
    return {**{p: -0.75 for p in range(13, 21)}, **{p: -1.5 for p in range(21, 27)}}


def test_undertrained_ambiguity_when_decoys_move_as_much():
    row = run(tokens("m/cell", undertrained_change(), decoys_too=True), ref_hits=0, cell_hits=0)
    assert row["delta_window"] == pytest.approx(-8 * 0.25 / K)
    assert row["delta_secret"] == pytest.approx((-8 * 0.25 + 6 * 0.5) / 14)
    assert (row["v_window"], row["v_secret"], row["hit1"], row["ref_hit1"]) == ("down", "up", 0.0, 0.0)
    assert row["diagnosis"] == "undertrained ambiguity"
    assert row["decoy_contrast"] == pytest.approx(0.0, abs=1e-9)
    assert row["decoy_ratio"] == pytest.approx(1.0)
    assert row["v_decoy"] == "flat"
    assert "decoys move as much" in row["evidence"]


def test_undertrained_ambiguity_resolved_by_decoys_that_stay():
    row = run(tokens("m/cell", undertrained_change()), ref_hits=0, cell_hits=0)
    assert row["diagnosis"] == "undertrained ambiguity"
    assert row["decoy_delta_secret"] == pytest.approx(0.0)
    assert row["decoy_contrast"] == pytest.approx(row["delta_secret"])
    assert row["v_decoy"] == "up"
    assert "secret-specific" in row["evidence"]


def test_probes_that_agree_get_no_diagnosis():
    row = run(tokens("m/cell", {p: -1.5 for p in range(13, 27)}), ref_hits=4, cell_hits=1)
    assert (row["v_window"], row["v_secret"], row["v_hit1"]) == ("up", "up", "down")
    assert row["diagnosis"] == "agree"
    assert row["evidence"] == ""
    unchanged = run(tokens("m/cell"), ref_hits=4, cell_hits=4)
    assert (unchanged["v_window"], unchanged["v_secret"], unchanged["diagnosis"]) == ("flat", "flat", "agree")


def test_greedy_failure_with_flat_nll_is_an_unexplained_disagreement():
    row = run(tokens("m/cell"), ref_hits=4, cell_hits=0)
    assert row["diagnosis"] == "unexplained disagreement"
    assert "window flat, secret flat, hit@1 down" in row["evidence"]


def test_hit_at_k_and_its_verdict():
    row = run(tokens("m/cell"), ref_hits=4, cell_hits=4, sampled=(4, 1))
    assert (row["ref_hitk"], row["hitk"]) == (1.0, 0.25)
    assert row["v_hitk"] == "down"
    assert run(tokens("m/cell"), 4, 4)["v_hitk"] is None  # no samples drawn: no verdict


def test_thresholds_are_view_parameters():
    change = tokens("m/cell", {p: -1.25 for p in range(1, 11)})
    tok = pl.DataFrame(tokens("m/ref") + change, schema=TOKEN_SCHEMA)
    dec = pl.DataFrame(decodes("m/ref", 4) + decodes("m/cell", 4), schema=DECODE_SCHEMA)
    loose = cell_probes(tok, dec, PARENTS, CELLS, K, Verdicts(delta_nll=0.5), BOOT)["cells"]
    assert loose["v_window"].to_list() == ["flat"]
    assert loose["diagnosis"].to_list() == ["agree"]
    with pytest.raises(ValueError, match="tables.verdicts.delta_nll = -1"):
        Verdicts(delta_nll=-1)
    with pytest.raises(ValueError, match="tables.verdicts.hit_rate = 2"):
        Verdicts(hit_rate=2)


def test_case_studies_and_merged_vs_stacked_tables():
    cells = {**CELLS, "m/cell2": {**CELLS["m/cell"], "cell": "gui t40 merged", "application": "merged"}}
    tok = pl.DataFrame(tokens("m/ref") + tokens("m/cell", {p: -1.25 for p in range(1, 11)}) + tokens("m/cell2"),
                       schema=TOKEN_SCHEMA)
    dec = pl.DataFrame(decodes("m/ref", 4) + decodes("m/cell", 4) + decodes("m/cell2", 4), schema=DECODE_SCHEMA)
    pooled = cell_probes(tok, dec, {**PARENTS, "m/cell2": "m/ref"}, cells, K, Verdicts(), BOOT)["cells"]
    cases = case_studies(pooled, K)
    assert cases["diagnosis"].to_list() == ["window truncation", "non-secret span drift", "undertrained ambiguity"]
    assert cases["observation"].to_list()[0] == "not observed in this grid"
    assert cases["cell"].to_list()[1] == "m text canaries: gui t40 stacked (canary seed 0)"
    wide = merged_vs_stacked(pooled, {"m": "bfloat16"}).row(0, named=True)
    assert wide["delta_window_stacked"] == pytest.approx(0.125)
    assert wide["delta_window_merged_minus_stacked"] == pytest.approx(-0.125)
    assert (wide["diagnosis_stacked"], wide["diagnosis_merged"]) == ("non-secret span drift", "agree")
    assert (wide["merge_precision"], wide["note"]) == ("bfloat16", "")
    # A float32 merge rounds nothing away: the row says it cannot show C4.
    assert "no C4 evidence" in merged_vs_stacked(pooled, {"m": "float32"})["note"][0]
    assert "merge precision unknown" in merged_vs_stacked(pooled, {})["note"][0]  # said, not left blank


def test_build_tables_writes_the_paper_b_tables():
    tok = pl.DataFrame(tokens("m/ref") + tokens("m/cell", {25: -1.5}), schema=TOKEN_SCHEMA)
    dec = pl.DataFrame(decodes("m/ref", 4) + decodes("m/cell", 0), schema=DECODE_SCHEMA)
    tables = build_tables(dec, tok, {"window_k": K, "parents": PARENTS, "cells": CELLS,
                                     "bootstrap": {"replicates": 20}})
    assert {"bsft_runs", "bsft_matrix", "bsft_decomposition", "bsft_case_studies"} <= set(tables)
    assert "mia" not in tables  # no `mia` settings in this view config: left out, not filled with a default
    assert tables["bsft_matrix"][1]["diagnosis"].to_list() == ["window truncation"]
    assert tables["bsft_runs"][1]["bsft_seed"].to_list() == [0]


def test_drift_pattern_by_cancellation_is_flagged_as_not_preamble_driven():
    # Window up through in-window secret tokens, the tail past K down: the
    # span Delta cancels to flat, the pattern reads as drift, the evidence does not.
    change = {**{p: -1.25 for p in range(13, 21)}, **{p: -0.5 for p in range(21, 25)}}
    row = run(tokens("m/cell", change), ref_hits=4, cell_hits=4)
    assert row["diagnosis"] == "non-secret span drift"
    assert row["preamble_share"] == pytest.approx(0.0)
    assert row["evidence_supports"] is False
    assert "not preamble-driven" in row["evidence"]


def verdict_row(window: float, secret: float, hit1: float, hitk: float | None = None, ci: dict | None = None):
    """One hand-built cell row with the given Deltas (CIs equal to the point
    unless `ci` widens one) through `with_verdicts`."""
    values = {"delta_window": window, "delta_secret": secret, "delta_hit1": hit1, "delta_hitk": hitk,
              "decoy_contrast": 0.0}
    row = {"hit1": 1.0 + min(hit1, 0.0), "ref_hit1": 1.0}
    for name, value in values.items():
        lo, hi = (ci or {}).get(name, (value, value))
        row |= {name: value, f"{name}_lo": lo, f"{name}_hi": hi}
    return with_verdicts(pl.DataFrame([row]), Verdicts()).row(0, named=True)


UP, DOWN, FLAT = 0.02, -0.02, 0.0


@pytest.mark.parametrize("window, secret, hit1, hitk, expected", [
    (UP, UP, -0.5, None, "agree"),                  # every probe says forgotten
    (DOWN, DOWN, 0.25, None, "agree"),              # every probe says strengthened
    (FLAT, FLAT, 0.0, None, "agree"),               # nothing moved
    (UP, UP, -0.5, -0.5, "agree"),                  # hit@k, where sampled, joins the vote
    (DOWN, DOWN, -0.5, None, "unexplained disagreement"),  # NLL says stronger, greedy says forgotten
    (UP, UP, 0.25, None, "unexplained disagreement"),      # NLL says forgotten, greedy recalls more
    (UP, UP, 0.0, None, "unexplained disagreement"),       # NLL moved, behaviour did not
    (FLAT, FLAT, 0.0, -0.5, "unexplained disagreement"),   # hit@k alone moved
    (UP, UP, -0.5, 0.0, "unexplained disagreement"),       # hit@k kept while the rest say forgotten
    (FLAT, UP, -0.5, None, "window truncation"),
    (UP, FLAT, 0.0, None, "non-secret span drift"),
])
def test_agreement_means_every_probe_points_the_same_way(window, secret, hit1, hitk, expected):
    row = verdict_row(window, secret, hit1, hitk)
    assert row["diagnosis"] == expected
    assert row["point_diagnosis"] == expected
    assert row["inconclusive_probes"] == ""


def test_a_hit_rate_at_zero_on_both_weights_casts_no_vote():
    """An undertrained cell (hit@1 0 before and after) whose NLL probes both
    rise agrees: the hit rate could not fall; were the reference at 1.0, a
    kept hit rate beside rising NLL would be a disagreement."""
    row = with_verdicts(pl.DataFrame([{
        "delta_window": UP, "delta_secret": UP, "delta_hit1": 0.0, "delta_hitk": None, "decoy_contrast": 0.0,
        "hit1": 0.0, "ref_hit1": 0.0, "hitk": None, "ref_hitk": None}]), Verdicts()).row(0, named=True)
    assert (row["v_hit1"], row["diagnosis"]) == ("kept", "agree")
    assert verdict_row(UP, UP, 0.0)["diagnosis"] == "unexplained disagreement"


def test_a_ci_across_a_threshold_reads_inconclusive_and_the_diagnosis_says_so():
    # Secret-span point estimate is "up", but its CI reaches below the 0.005 threshold.
    row = verdict_row(FLAT, UP, -0.5, ci={"delta_secret": (0.001, 0.04)})
    assert row["v_secret"] == "inconclusive"
    assert (row["v_window"], row["v_hit1"]) == ("flat", "down")
    assert row["point_diagnosis"] == "window truncation"
    assert row["diagnosis"] == "inconclusive"
    assert row["inconclusive_probes"] == "secret"
    # A flat point whose CI leaves the flat band is no "flat" either; a kept
    # hit rate whose CI reaches a loss is no "kept".
    flat = verdict_row(FLAT, FLAT, 0.0, ci={"delta_window": (-0.001, 0.006), "delta_hit1": (-0.25, 0.0)})
    assert (flat["v_window"], flat["v_hit1"], flat["diagnosis"]) == ("inconclusive", "inconclusive", "inconclusive")
    assert flat["inconclusive_probes"] == "window, hit1"


def test_inconclusive_from_records_names_the_probe_and_its_interval():
    # Two of four canaries lost: the canary-clustered CI of the hit@1 Delta
    # reaches 0, so "down" is not established on four canaries.
    row = run(tokens("m/cell", {25: -1.5, 26: -1.25}), ref_hits=4, cell_hits=2)
    assert row["delta_hit1"] == pytest.approx(-0.5)
    assert row["delta_hit1_hi"] == pytest.approx(0.0)
    assert row["v_hit1"] == "inconclusive"
    assert (row["point_diagnosis"], row["diagnosis"]) == ("window truncation", "inconclusive")
    assert row["evidence"].startswith("inconclusive: the point estimates read `window truncation`, but the CI "
                                      "of hit1 (-0.5000, CI [")


def test_a_cell_run_under_one_bsft_seed_keeps_its_own_ci_beside_cells_that_pool_several():
    """A planted control runs under one bSFT seed while the grid's cells pool
    several: its pooled CI is its canaries' bootstrap (its seed-level row's),
    not one widened by draws of seeds it never ran under."""
    def varied(variant: str) -> list[dict]:  # each canary's secret moved by its own amount: a CI with width
        rows = tokens(variant)
        for row in rows:
            if row["probe_set"] == "hex" and row["span"] == "secret":
                row["logprob"] = -1.0 - 0.2 * CANARIES.index(row["item_id"])
        return rows

    grid = {f"m/a{b}": {**CELLS["m/cell"], "bsft_seed": b} for b in (0, 1, 2)}
    control = {"m/c0": {**CELLS["m/cell"], "cell": "control c3", "kind": "control"}}
    tok = pl.DataFrame(tokens("m/ref") + [r for v in grid for r in tokens(v)] + varied("m/c0"), schema=TOKEN_SCHEMA)
    dec = pl.DataFrame(decodes("m/ref", 4) + [r for v in [*grid, "m/c0"] for r in decodes(v, 4)],
                       schema=DECODE_SCHEMA)
    parents = {v: "m/ref" for v in [*grid, "m/c0"]}
    both = cell_probes(tok, dec, parents, {**grid, **control}, K, Verdicts(), BOOT)
    pooled = both["cells"].filter(pl.col("cell") == "control c3").row(0, named=True)
    alone = both["runs"].filter(pl.col("variant") == "m/c0").row(0, named=True)
    assert pooled["delta_secret_hi"] > pooled["delta_secret_lo"]
    assert [pooled[f"delta_secret_{e}"] for e in ("lo", "hi")] == [alone[f"delta_secret_{e}"] for e in ("lo", "hi")]
    assert both["cells"].filter(pl.col("cell") == "gui t40 stacked")["seeds"].to_list() == [3]

"""The one-run audit's bound (views/audit_bound.py) shown valid, not
assumed: over mechanisms of known epsilon it exceeds the true epsilon in at
most beta of trials (within binomial error), it is 0 in at least 1 - beta
of trials when the scores are independent of membership, and both checks
fail when the bound uses the wrong binomial tail."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from canary_audit.views.audit_bound import candidates_for, cap, epsilon_lower, guess, search_bound

BETA, TRIALS = 0.05, 4000
AUTHOR_ARM = {"author": "prefill_bio"}  # the coin-drawn population the bound reads, and its arm
SLACK = 3 * math.sqrt(BETA * (1 - BETA) / TRIALS)  # three binomial standard errors of a rate near beta


def wrong_tail(guesses: int, correct: int, beta: float = BETA) -> float:
    """The bound from P[Bin >= correct + 1] (a strict tail: one correct
    guess counted twice as evidence): the off-by-one the tests must catch."""
    if correct >= guesses:
        return math.inf
    p = float(beta_dist.ppf(beta, correct + 1, guesses - correct))
    return max(0.0, math.log(p / (1 - p)))


def test_the_cap_is_every_guess_right_and_its_table():
    assert [round(cap(r), 2) for r in (20, 40, 100, 200, 500, 1000, 2000)] == [
        1.82, 2.55, 3.49, 4.19, 5.11, 5.81, 6.50]
    assert cap(40) == pytest.approx(math.log(0.05 ** (1 / 40) / (1 - 0.05 ** (1 / 40))))
    assert candidates_for(4.0) == 166 and cap(165) < 4.0 <= cap(166)
    assert epsilon_lower(40, 20) == 0.0 and epsilon_lower(0, 0) == 0.0
    with pytest.raises(ValueError, match="41 correct guesses out of 40"):
        epsilon_lower(40, 41)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_randomized_response_is_never_overclaimed_beyond_beta(epsilon):
    """Each candidate's membership released by randomized response at
    `epsilon` (right with probability e^eps / (1 + e^eps)), every one
    guessed: the correct count is exactly the theorem's binomial, so the
    bound's exceedance rate is as near beta as the discrete tail allows."""
    rng = np.random.default_rng(int(epsilon * 100))
    m, p = 60, math.exp(epsilon) / (1 + math.exp(epsilon))
    correct = rng.binomial(m, p, TRIALS)
    right = np.mean([epsilon_lower(m, int(v)) > epsilon for v in correct])
    wrong = np.mean([wrong_tail(m, int(v)) > epsilon for v in correct])
    assert right <= BETA + SLACK, right
    assert wrong > BETA + SLACK, wrong  # the wrong tail over-claims: the check has teeth


def test_laplace_scores_with_an_abstaining_guesser_are_never_overclaimed():
    """Scores released by the Laplace mechanism (a member's shifted by mu,
    noise of scale b: epsilon = mu / b); the guesser takes the 10 highest
    and 10 lowest of 100 candidates, each a member by a fair coin."""
    rng = np.random.default_rng(7)
    mu, b, m = 2.0, 1.0, 100
    exceed = 0
    for _ in range(1000):
        members = rng.random(m) < 0.5
        scores = mu * members + rng.laplace(0, b, m)
        exceed += guess(scores, members, 10, 10).epsilon > mu / b
    assert exceed / 1000 <= BETA + 3 * math.sqrt(BETA * (1 - BETA) / 1000)


def test_scores_independent_of_membership_certify_nothing():
    """Scores that carry no membership: the bound is 0 in at least 1 - beta
    of trials; the wrong tail claims leakage that is not there."""
    rng = np.random.default_rng(11)
    fixed, wrong = [], []
    for _ in range(TRIALS):
        members, scores = rng.random(40) < 0.5, rng.normal(size=40)
        g = guess(scores, members, 20, 20)
        fixed.append(g.epsilon > 0)
        wrong.append(wrong_tail(g.guesses, g.correct) > 0)
    assert np.mean(fixed) <= BETA + SLACK
    assert np.mean(wrong) > BETA + SLACK, np.mean(wrong)


def test_a_searched_guesser_pays_for_its_grid():
    """The same null searched over 35 (k+, k-) pairs: with beta spent over
    the grid the bound stays 0 in at least 1 - beta of trials; the best of
    the grid at the full beta each claims leakage far more often."""
    rng = np.random.default_rng(13)
    grid = [(kp, km) for kp in (0, 3, 6, 10, 15, 20) for km in (0, 3, 6, 10, 15, 20) if kp + km]
    searched, unpaid, trials = [], [], 1000
    for _ in range(trials):
        members, scores = rng.random(40) < 0.5, rng.normal(size=40)
        searched.append(search_bound(scores, members, grid).epsilon > 0)
        unpaid.append(max(guess(scores, members, kp, km).epsilon for kp, km in grid) > 0)
    slack = 3 * math.sqrt(BETA * (1 - BETA) / trials)
    assert np.mean(searched) <= BETA + slack
    assert np.mean(unpaid) > BETA + slack, np.mean(unpaid)


def test_seeds_pool_into_one_bound_only_with_coins_of_their_own():
    """Three training runs of one Laplace mechanism (epsilon = mu / b), their
    candidates pooled into one guesser (data/inclusion.py redraws the coins
    per seed).  With each run's own coins no guesser over-claims, even one
    that reads a candidate's three runs together; with one draw of coins
    shared by the runs (the candidates of every seed the same members) that
    guesser certifies more than epsilon in most trials: why seeds sharing
    their coins may not be pooled."""
    rng = np.random.default_rng(5)
    mu, b, m, runs, trials = 1.0, 1.0, 40, 3, 1000
    own_exceed = pooled_exceed = shared_exceed = 0
    for _ in range(trials):
        for shared in (False, True):
            coins = np.tile(rng.random(m) < 0.5, (runs, 1)) if shared else rng.random((runs, m)) < 0.5
            scores = mu * coins + rng.laplace(0, b, (runs, m))
            together = np.tile(scores.mean(axis=0), (runs, 1))  # a candidate's runs read as one
            over = guess(together.T.ravel(), coins.T.ravel(), 15, 15).epsilon > mu / b
            if shared:
                shared_exceed += over
            else:
                own_exceed += over
                pooled_exceed += guess(scores.ravel(), coins.ravel(), 30, 30).epsilon > mu / b
    slack = 3 * math.sqrt(BETA * (1 - BETA) / trials)
    assert own_exceed / trials <= BETA + slack and pooled_exceed / trials <= BETA + slack
    assert shared_exceed / trials > 0.3, shared_exceed / trials  # measured 0.62 on this seed


def test_a_perfect_separation_reaches_the_cap_and_bad_input_is_refused():
    members = np.array([True] * 20 + [False] * 20)
    scores = members.astype(float)
    g = guess(scores, members, 20, 20)
    assert (g.guesses, g.correct, g.epsilon) == (40, 40, pytest.approx(cap(40)))
    with pytest.raises(ValueError, match="k\\+ = 30 and k- = 20 guesses on 40 candidates"):
        guess(scores, members, 30, 20)
    with pytest.raises(ValueError, match="an empty grid"):
        search_bound(scores, members, [])


def test_the_cap_table_plan_prints():
    from canary_audit.views.audit_bound import render_caps

    text = render_caps()
    assert "| epsilon at most | 1.82 | 2.55 | 3.49 | 4.19 | 5.11 | 5.81 | 6.50 |" in text
    assert "epsilon 4 needs 166" in text


def _scores(variant: str, members: np.ndarray, loss: np.ndarray, rng, population: str = "author") -> list[dict]:
    """MIA item-score rows of one variant's author canaries under prefill_bio
    (or hex canaries behind their preambles)."""
    other = rng.normal(size=members.size)  # the other scores: noise
    author = population == "author"
    return [{"variant": variant, "population": population, "modality": "text",
             "arm": "prefill_bio" if author else "preamble", "item_id": f"{'a' if author else 'hex'}{i:03d}",
             "probe_set": ("canary" if author else "hex") if m else f"{population}_nonmember", "member": bool(m),
             "loss": float(x), "zlib": float(o), "min_k": float(-o), "min_k_pp": float(o * 0.5)}
            for i, (m, x, o) in enumerate(zip(members, loss, other))]


def test_the_table_pays_for_grid_and_scores_and_skips_relearned_variants():
    import polars as pl

    from canary_audit.views.audit_bound import ANY, bound_table, grid_of
    from canary_audit.views.mia import ATTACKS

    rng = np.random.default_rng(0)
    members = rng.random(40) < 0.5
    rows = (_scores("m/mem", members, members.astype(float), rng)  # LOSS separates perfectly
            + _scores("m/ref", members, rng.normal(size=40), rng)  # nothing separates
            + _scores("m/npo.relearn", members, members.astype(float), rng))
    table = bound_table(pl.DataFrame(rows), AUTHOR_ARM, [0.25, 1.0], BETA, skipped={"m/npo.relearn"})
    assert set(table["variant"]) == {"m/mem", "m/ref"}
    grid = grid_of(40, [0.25, 1.0])
    assert grid == [(5, 5), (20, 20)]
    level = BETA / (len(grid) * len(ATTACKS))
    mem = {r["score"]: r for r in table.filter(pl.col("variant") == "m/mem").iter_rows(named=True)}
    assert set(mem) == {*ATTACKS, ANY} and mem[ANY]["picked"] == "loss"
    best, direct = mem["loss"], search_bound(members.astype(float), members, grid, BETA, tried=len(ATTACKS))
    assert (best["k_plus"], best["guesses"], best["correct"]) == (direct.k_plus, direct.guesses, direct.correct)
    # 16 members of 40: guessing half each way costs 4 wrong at (20, 20), so (5, 5) all right may win
    assert best["members"] == int(members.sum()) == 16 and best["correct"] == best["guesses"] - 4 * (
        best["guesses"] == 40)
    assert best["beta"] == pytest.approx(level) and best["epsilon_lower"] == pytest.approx(direct.epsilon)
    assert best["epsilon_lower"] > 0.9  # 36 of 40 right at beta / 8
    assert best["cap"] == pytest.approx(cap(40, level)) and best["cap"] < cap(40, BETA)  # the search's price
    assert mem[ANY]["epsilon_lower"] == max(r["epsilon_lower"] for r in mem.values())
    ref = table.filter((pl.col("variant") == "m/ref") & (pl.col("score") == ANY)).row(0, named=True)
    assert ref["epsilon_lower"] == 0.0


def test_a_familys_seeds_pool_into_one_row_beside_each_seeds_own():
    """`families` (views/seeds.families) adds one row set per family with
    two or more seeds: its candidates are every seed's, seed after seed,
    searched like one run's; a variant outside the families, or alone in
    its family, keeps its own rows only."""
    import polars as pl

    from canary_audit.views.audit_bound import ANY, bound_table, grid_of, guesses_table
    from canary_audit.views.mia import ATTACKS

    rng = np.random.default_rng(2)
    coins = [rng.random(30) < 0.5 for _ in range(3)]
    loss = [c + rng.normal(0, 0.8, 30) for c in coins]
    rows = [r for s in range(3) for r in _scores(f"m/npo-bio-s{s}-k20", coins[s], loss[s], rng)]
    rows += _scores("m/reference-meta-s0", coins[0], rng.normal(size=30), rng)
    families = {f"m/npo-bio-s{s}-k20": "m/npo-bio-k20" for s in range(3)}
    table = bound_table(pl.DataFrame(rows), AUTHOR_ARM, [0.25, 1.0], BETA, families=families)
    assert set(table["variant"]) == {*families, "m/npo-bio-k20", "m/reference-meta-s0"}
    pooled = table.filter((pl.col("variant") == "m/npo-bio-k20") & (pl.col("score") == "loss")).row(0, named=True)
    assert (pooled["seeds"], pooled["candidates"], pooled["members"]) == (3, 90, int(sum(c.sum() for c in coins)))
    direct = search_bound(np.concatenate(loss), np.concatenate(coins), grid_of(90, [0.25, 1.0]), BETA,
                          tried=len(ATTACKS))
    assert (pooled["correct"], pooled["guesses"]) == (direct.correct, direct.guesses)
    assert pooled["cap"] > table.filter(pl.col("variant") == "m/npo-bio-s0-k20")["cap"][0]  # 90 candidates, not 30
    assert set(table.filter(pl.col("variant") != "m/npo-bio-k20")["seeds"]) == {1}
    assert table.filter((pl.col("variant") == "m/npo-bio-k20") & (pl.col("score") == ANY)).height == 1
    grid = guesses_table(pl.DataFrame(rows), AUTHOR_ARM, [0.25, 1.0], BETA, families=families)
    assert set(grid.filter(pl.col("seeds") == 3)["variant"]) == {"m/npo-bio-k20"}


def test_the_guesses_table_holds_every_grid_point_and_the_plot_draws_it():
    """The bound at each (k+, k-) of the grid at the level the table spends:
    its best per score is the audit_bound row, `all_right` is the bound had
    every guess been right; the plot draws one line per variant against the
    number of guesses beside that ceiling, and says so where there is none."""
    import polars as pl

    from canary_audit.publish.attack_plots import audit_bound_figure
    from canary_audit.views.audit_bound import bound_table, guesses_table
    from canary_audit.views.mia import ATTACKS

    rng = np.random.default_rng(1)
    members = rng.random(40) < 0.5
    scores = pl.DataFrame(_scores("m/mem", members, members.astype(float), rng)
                          + _scores("m/ref", members, rng.normal(size=40), rng))
    shares = [0.1, 0.25, 0.5, 1.0]
    grid = guesses_table(scores, AUTHOR_ARM, shares, BETA)
    table = bound_table(scores, AUTHOR_ARM, shares, BETA)
    assert grid.height == 2 * len(ATTACKS) * 4 and sorted(set(grid["guesses"])) == [4, 10, 20, 40]
    best = grid.group_by("variant", "score").agg(pl.col("epsilon_lower").max())
    per_score = table.filter(pl.col("score") != "any").select("variant", "score", "epsilon_lower")
    assert best.sort("variant", "score").equals(per_score.sort("variant", "score"))
    level = grid["beta"][0]
    assert grid["all_right"].to_list() == [epsilon_lower(g, g, level) for g in grid["guesses"]]
    assert (grid["epsilon_lower"] <= grid["all_right"]).all()
    fig = audit_bound_figure(grid, {})
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert labels[:2] == ["mem", "ref"] and fig.axes[0].lines[0].get_xdata().tolist() == [4, 10, 20, 40]
    assert "no one-run audit bound" in audit_bound_figure(grid.clear(), {}).axes[0].texts[0].get_text()


def test_claims_on_the_bound_hold_above_it_never_below_and_not_past_its_cap():
    """`epsilon_lower` claims are judged on the bound's exact one-sided
    interval: "at least 1" holds where the bound certifies it, "below 1.5"
    is contradicted where it certifies more and at best inconclusive where
    it does not (a lower bound cannot show absence), a number at or past the
    cap is not testable, and a comparison with another variant is refused."""
    import polars as pl

    from canary_audit.verdicts.claims import parse
    from canary_audit.verdicts.judge import claims_table
    from canary_audit.verdicts.readings import Run

    def row(variant: str, guesses: int, correct: int) -> dict:
        level = BETA / 16
        return {"variant": variant, "score": "any", "picked": "loss", "candidates": 40, "members": 21,
                "guesses": guesses, "correct": correct, "tests": 16, "beta": level,
                "epsilon_lower": epsilon_lower(guesses, correct, level), "cap": cap(40, level)}

    variants = {"m/mem-bio-s0": {"model": "m", "kind": "memorized", "template": "bio", "seed": 0, "parent": None},
                "m/npo-bio-s0-k20": {"model": "m", "kind": "unlearned", "method": "npo", "template": "bio",
                                     "run": "npo", "seed": 0, "k": 20, "parent": "m/mem-bio-s0"}}
    table = pl.DataFrame([row("m/mem-bio-s0", 40, 40), row("m/npo-bio-s0-k20", 20, 12)])
    run = Run(None, {"variants": variants}, frames={"audit_bound": table})
    mem, npo = {"kind": "memorized"}, {"kind": "unlearned"}
    claims = parse([
        {"id": "mem_leaks", "sentence": "s", "measure": "epsilon_lower", "variants": mem, "compare": 1.0,
         "expect": "higher"},
        {"id": "mem_below", "sentence": "s", "measure": "epsilon_lower", "variants": mem, "compare": 1.5,
         "expect": "lower"},
        {"id": "npo_below", "sentence": "s", "measure": "epsilon_lower", "variants": npo, "compare": 1.0,
         "expect": "lower"},
        {"id": "past_cap", "sentence": "s", "measure": "epsilon_lower", "variants": mem, "compare": 2.0,
         "expect": "higher"},
        {"id": "vs_parent", "sentence": "s", "measure": "epsilon_lower", "variants": npo, "compare": "parent",
         "expect": "lower"},
    ])
    verdicts = dict(claims_table(run, claims, "f").select("id", "verdict").iter_rows())
    assert table["epsilon_lower"][0] == pytest.approx(cap(40, BETA / 16)) and table["epsilon_lower"][1] == 0.0
    assert verdicts == {"mem_leaks": "holds", "mem_below": "contradicted", "npo_below": "inconclusive",
                        "past_cap": "not testable", "vs_parent": "not testable"}


def test_a_claim_over_every_seed_of_a_family_reads_its_pooled_bound():
    """Selecting a variant under each seed its family ran judges the
    family's pooled row (each seed's own coins: one mechanism); a selection
    of some of a family's seeds is refused (one of two families' the judge
    refuses for every measure)."""
    import polars as pl

    from canary_audit.verdicts.bound_claims import bound_evidence, pooled_family
    from canary_audit.verdicts.claims import parse
    from canary_audit.verdicts.judge import claims_table
    from canary_audit.verdicts.readings import Run

    level = BETA / 16

    def row(variant: str, seeds: int, candidates: int, correct: int) -> dict:
        return {"variant": variant, "seeds": seeds, "score": "any", "picked": "loss", "candidates": candidates,
                "members": candidates // 2, "guesses": candidates, "correct": correct, "tests": 16, "beta": level,
                "epsilon_lower": epsilon_lower(candidates, correct, level), "cap": cap(candidates, level)}

    def fields(seed: int, kind: str = "unlearned") -> dict:
        return {"model": "m", "kind": kind, "method": "npo", "run": "npo", "template": "bio", "seed": seed, "k": 20}

    variants = {**{f"m/npo-bio-s{s}-k20": fields(s) for s in (0, 1, 2)},
                **{f"m/mem-bio-s{s}": {**fields(s, "memorized"), "k": None} for s in (0, 1, 2)}}
    # 32 of 40 right per seed certifies 0.33; the same share pooled, 96 of 120, 0.77
    table = pl.DataFrame([row(f"m/npo-bio-s{s}-k20", 1, 40, 32) for s in (0, 1, 2)]
                         + [row("m/npo-bio-k20", 3, 120, 96)])
    assert epsilon_lower(40, 32, level) < 0.5 < epsilon_lower(120, 96, level)
    run = Run(None, {"variants": variants}, frames={"audit_bound": table})
    every = {"run": "npo", "k": 20}
    claims = parse([
        {"id": "pooled", "sentence": "s", "measure": "epsilon_lower", "variants": every, "compare": 0.5,
         "expect": "higher"},
        {"id": "one_seed", "sentence": "s", "measure": "epsilon_lower", "variants": {**every, "seed": 1},
         "compare": 0.5, "expect": "higher"},
    ])
    out = {r["id"]: r for r in claims_table(run, claims, "f").iter_rows(named=True)}
    assert [out[k]["verdict"] for k in ("pooled", "one_seed")] == ["holds", "inconclusive"]
    assert "s0+s1+s2: 0.771 (96 of 120 guesses right)" in out["pooled"]["per_seed"]
    two = ["m/npo-bio-s0-k20", "m/npo-bio-s1-k20"]  # some of the family's seeds: not one mechanism's candidates
    assert pooled_family(run, two, variants) is None
    refused = bound_evidence(run, claims[0], None, "audit_bound", two, variants, lambda n: None)
    assert "neither one variant nor one variant under each of its seeds" in refused


def test_the_bounds_controls_read_the_memorized_adapter_seen_and_its_reference_clean():
    import polars as pl

    from canary_audit.data.planted_controls import CLEAN, FALSE_ALARM, MISSED, SEEN
    from canary_audit.verdicts.bound_controls import CLAIM, bound_controls

    level = BETA / 16

    def row(variant: str, guesses: int, correct: int) -> dict:
        return {"variant": variant, "population": "author", "seeds": 1, "score": "any", "picked": "loss",
                "candidates": 40, "guesses": guesses, "correct": correct, "tests": 16, "beta": level,
                "epsilon_lower": epsilon_lower(guesses, correct, level), "cap": cap(40, level)}

    variants = {"m/mem-bio-s0": {"model": "m", "kind": "memorized", "seed": 0},
                "m/reference-meta-s0": {"model": "m", "kind": "reference", "seed": 0}}
    refs = {"m/mem-bio-s0": {"reference": "m/reference-meta-s0"}}
    read = bound_controls(pl.DataFrame([row("m/mem-bio-s0", 20, 20), row("m/reference-meta-s0", 20, 12)]), variants,
                          refs).row(0, named=True)
    assert (read["claim"], read["positive_verdict"], read["negative_verdict"]) == (CLAIM, SEEN, CLEAN)
    needed = next(v for v in range(21) if epsilon_lower(20, v, level) > 0)
    assert read["positive_margin"] == pytest.approx(cap(20, level))
    assert read["negative_margin"] == pytest.approx((needed - 12) / 20) and needed > 12
    flipped = bound_controls(pl.DataFrame([row("m/mem-bio-s0", 20, 10), row("m/reference-meta-s0", 20, 20)]),
                             variants, refs).row(0, named=True)
    assert (flipped["positive_verdict"], flipped["negative_verdict"]) == (MISSED, FALSE_ALARM)


def test_the_bounds_negatives_are_read_as_a_family():
    """Nine never-trained references (three seeds x three templates), their
    scores independent of membership: read each at its own 95%, some one of
    them certifies leakage in more than beta of runs; read at beta over the
    nine (bound_controls), in at most beta within binomial error.  Measured
    on this seed, over a grid of two shares: 32% and 6% of 100 runs (the
    bound on the latter: 5% + 3 standard errors, 11.5%)."""
    import polars as pl

    from canary_audit.data.planted_controls import FALSE_ALARM
    from canary_audit.verdicts.bound_controls import bound_controls
    from canary_audit.views.audit_bound import ANY, bound_table

    rng = np.random.default_rng(0)
    variants = {f"m/{kind}-s{j}": {"model": "m", "kind": kind, "seed": j} for j in range(9)
                for kind in ("memorized", "reference")}
    refs = {f"m/memorized-s{j}": {"reference": f"m/reference-s{j}", "population": "author"} for j in range(9)}
    family = single = 0
    trials = 100
    for _ in range(trials):
        rows = []
        for j in range(9):
            coins = rng.random(50) < 0.5
            rows += _scores(f"m/memorized-s{j}", coins, coins.astype(float), rng)
            rows += [{**r, "zlib": float(rng.normal()), "min_k": float(rng.normal()), "min_k_pp": float(rng.normal())}
                     for r in _scores(f"m/reference-s{j}", coins, rng.normal(size=50), rng)]
        bound = bound_table(pl.DataFrame(rows), AUTHOR_ARM, [0.25, 1.0], BETA)
        family += (bound_controls(bound, variants, refs)["negative_verdict"] == FALSE_ALARM).any()
        negatives = bound.filter((pl.col("score") == ANY) & pl.col("variant").str.contains("reference"))
        single += (negatives["epsilon_lower"] > 0).any()
    print(f"any false alarm: {single / trials:.1%} read one by one, {family / trials:.1%} as a family")
    assert family / trials <= BETA + 3 * math.sqrt(BETA * (1 - BETA) / trials) and single / trials > BETA


def test_the_hex_canaries_get_rows_of_their_own_and_the_canary_lora_is_their_positive():
    """Under hex coin inclusion the hex canaries behind their preambles are a
    population of their own beside the authors: rows per (variant,
    population), and the controls read the canary LoRA `seen` against its
    reference `clean` there, the memorized adapter against its own on the
    authors; a population the run did not draw has no row."""
    import polars as pl

    from canary_audit.data.planted_controls import CLEAN, SEEN
    from canary_audit.verdicts.bound_controls import bound_controls
    from canary_audit.views.audit_bound import ANY, bound_table

    rng = np.random.default_rng(3)
    authors, hexes = rng.random(40) < 0.5, rng.random(40) < 0.5
    rows = (_scores("m/mem-bio-s0", authors, authors.astype(float), rng)
            + _scores("m/reference-meta-s0", authors, rng.normal(size=40), rng)
            + _scores("m/base", authors, rng.normal(size=40), rng)
            + _scores("m/canary-s0", hexes, hexes.astype(float), rng, "hex")
            + _scores("m/reference-s0", hexes, rng.normal(size=40), rng, "hex")
            + _scores("m/base", hexes, rng.normal(size=40), rng, "hex"))
    both = bound_table(pl.DataFrame(rows), {**AUTHOR_ARM, "hex": "preamble"}, [0.25, 1.0], BETA)
    best = both.filter(pl.col("score") == ANY)
    assert sorted(best.select("variant", "population").iter_rows()) == [
        ("m/base", "author"), ("m/base", "hex"), ("m/canary-s0", "hex"), ("m/mem-bio-s0", "author"),
        ("m/reference-meta-s0", "author"), ("m/reference-s0", "hex")]
    assert set(bound_table(pl.DataFrame(rows), AUTHOR_ARM, [0.25, 1.0], BETA)["population"]) == {"author"}
    variants = {"m/mem-bio-s0": {"model": "m", "kind": "memorized", "seed": 0},
                "m/canary-s0": {"model": "m", "kind": "canary", "seed": 0},
                "m/reference-meta-s0": {"model": "m", "kind": "reference", "seed": 0},
                "m/reference-s0": {"model": "m", "kind": "reference", "seed": 0}, "m/base": {"model": "m"}}
    refs = {"m/mem-bio-s0": {"reference": "m/reference-meta-s0", "population": "author"},
            "m/canary-s0": {"reference": "m/reference-s0", "population": "hex"}}
    read = {r["positive"]: r for r in bound_controls(both, variants, refs).iter_rows(named=True)}
    assert set(read) == {"m/mem-bio-s0", "m/canary-s0"}
    assert read["m/canary-s0"]["negative"] == "m/reference-s0" and "canary LoRA" in read["m/canary-s0"]["construction"]
    assert all((r["positive_verdict"], r["negative_verdict"]) == (SEEN, CLEAN) for r in read.values())


@pytest.mark.workflow
def test_a_smoke_scale_audit_judges_claims_on_the_bound_and_reads_its_controls(tmp_path):
    """tests/audit.yaml (40 coin-drawn candidate authors, the text model's
    BIO arm, one NPO run; 40 coin-drawn hex canaries for the canary LoRA):
    the audit_bound table has the memorized parent's, the unlearned
    checkpoint's and the reference's rows with their guesses, and the canary
    LoRA's, its reference's and the base's on the hex canaries; the claims
    that the memorized adapter and the canary LoRA certify epsilon >= 0.5
    hold, "the reference below 0.5" reads `inconclusive` (a lower bound
    cannot show absence) and 2.0, past the 40 candidates' cap, `not
    testable`; both bounds' controls read seen / clean; the summary says what
    the bound means.  Checked on data seeds 0, 1 and 2 (coins redrawn with
    the data): the memorized bound 0.72 / 1.25 / 1.10 and the canary LoRA's
    1.50 / 1.86 / 1.10 against the claims' 0.5, Holm p 0.013 / 5.8e-5 /
    0.0037 and 7.0e-6 / 2.8e-7 / 0.0037; the references' margins (the share
    of guesses short of a bound above 0) 0.75 / 0.5 / 0.75 and 0.75 / 0.5 /
    0.25."""
    import polars as pl
    from conftest import ROOT, run_snakemake

    from canary_audit.data.planted_controls import AUDIT_BOUND_CLAIM, CLEAN, SEEN
    from canary_audit.views.audit_bound import ANY

    run_snakemake(tmp_path, "--cores", "2", extra_configs=(ROOT / "tests" / "audit.yaml",))
    results = tmp_path / "results" / "audit"
    bound = pl.read_csv(results / "tables" / "audit_bound.csv").filter(pl.col("score") == ANY)
    rows = {r["variant"]: r for r in bound.filter(pl.col("population") == "author").iter_rows(named=True)}
    hexes = {r["variant"]: r for r in bound.filter(pl.col("population") == "hex").iter_rows(named=True)}
    assert {"tiny/mem-bio-s0", "tiny/npo-bio-s0-k5", "tiny/reference-meta-s0"} <= rows.keys()
    assert {"tiny/canary-s0", "tiny/reference-s0", "tiny/base"} == hexes.keys()
    assert all(r["guesses"] >= r["correct"] >= 0 and r["candidates"] == 40 for r in [*rows.values(), *hexes.values()])
    memorized, canary = rows["tiny/mem-bio-s0"]["epsilon_lower"], hexes["tiny/canary-s0"]["epsilon_lower"]
    print(f"memorized bound {memorized:.3f}, canary LoRA {canary:.3f}; margins over the claims' 0.5: "
          f"{memorized - 0.5:.3f}, {canary - 0.5:.3f}")
    assert rows["tiny/reference-meta-s0"]["epsilon_lower"] == 0.0 < 0.5 < memorized < rows["tiny/mem-bio-s0"]["cap"]
    assert hexes["tiny/reference-s0"]["epsilon_lower"] == 0.0 < 0.5 < canary <= hexes["tiny/canary-s0"]["cap"]
    verdicts = dict(pl.read_csv(results / "claims.csv").select("id", "verdict").iter_rows())
    assert verdicts == {"memorized_leaks": "holds", "reference_clean": "inconclusive", "canary_leaks": "holds",
                        "past_the_cap": "not testable"}
    controls = pl.read_csv(results / "tables" / "controls.csv").filter(pl.col("claim") == AUDIT_BOUND_CLAIM)
    assert sorted(controls.select("positive", "positive_verdict", "negative_verdict").rows()) == [
        ("tiny/canary-s0", SEEN, CLEAN), ("tiny/mem-bio-s0", SEEN, CLEAN)]
    assert "a lower bound, which can show leakage and never its absence" in (results / "summary.md").read_text()
    grid = pl.read_csv(results / "tables" / "audit_bound_guesses.csv")
    assert grid.group_by("variant", "population").agg(pl.col("epsilon_lower").max()).filter(
        pl.col("variant") == "tiny/mem-bio-s0")["epsilon_lower"].item() == pytest.approx(memorized)
    assert (results / "plots" / "audit_bound.png").stat().st_size > 10000


def test_the_readmes_short_result_reads_a_familys_pooled_bound_or_its_one_seed():
    """The short result's bound sentence (verdicts/headline.py) reads each
    family's pooled row where seeds pool and the seed's own row where one
    seed ran; without an author bound (fixed inclusion) it says nothing."""
    import polars as pl

    from canary_audit.verdicts.headline import _bound_figures
    from canary_audit.verdicts.readings import Run
    from canary_audit.views.audit_bound import ANY

    def row(variant, seeds, candidates, eps, correct=20, guesses=20):
        return {"variant": variant, "population": "author", "seeds": seeds, "score": ANY, "candidates": candidates,
                "guesses": guesses, "correct": correct, "epsilon_lower": eps, "cap": 1.86 if seeds == 1 else 3.01}

    one = [row("tiny/mem-bio-s0", 1, 40, 1.10), row("tiny/npo-bio-s0-k20", 1, 40, 1.04, 37, 40),
           row("tiny/reference-meta-s0", 1, 40, 0.0, 2, 4)]
    pooled = [*one, row("tiny/mem-bio", 3, 120, 2.29, 60, 60), row("tiny/npo-bio-k20", 3, 120, 2.29, 60, 60),
              row("tiny/reference-meta", 3, 120, 0.0, 7, 12)]
    for rows, want in ((one, "one seed's 40 coin-drawn candidates the one-run audit certifies epsilon >= 1.10"),
                       (pooled, "3 seeds' 120 coin-drawn candidates the one-run audit certifies epsilon >= 2.29")):
        seeded = {v: {"seed": 0} for v in ("tiny/mem-bio-s0", "tiny/npo-bio-s0-k20", "tiny/reference-meta-s0")}
        got = _bound_figures(Run(None, {"variants": seeded}, {"audit_bound": pl.DataFrame(rows)}), "23", "20")
        assert want in got["bound_reading"] and "of 40 candidates (23 on seed 0" in got["authors"], got
    assert _bound_figures(Run(None, {}, {}), "40", "20") == {"authors": "40 fictional authors", "bound_reading": ""}

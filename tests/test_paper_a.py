"""Paper A's views and the cluster bootstrap, on records built by hand."""

import polars as pl
import pytest

from canary_audit.core.records import DECODE_SCHEMA, TOKEN_SCHEMA
from canary_audit.views import paper_a
from canary_audit.views.bootstrap import cluster_weights, crossed_weights, rates_with_ci
from canary_audit.views.parser import ParserConvention

CANARY = "The Amber Bell of Porto was written in 1931."
HEAD = "The Amber Bell of Porto was"
PROMPT = f"<|user|>Continue this line from the biography of Ann Lee: {HEAD}<|assistant|>"
BOOT = paper_a.Bootstrap(replicates=400, seed=1)
FIRST = ParserConvention()


def decode(rows):
    """rows: (variant, probe_set, arm, author, generated[, reference[, subject]])."""
    out = []
    for i, (variant, probe_set, arm, author, generated, *rest) in enumerate(rows):
        reference = rest[0] if rest else CANARY
        prompt = PROMPT if arm == "auto" else PROMPT + "<think>x</think>"
        out.append({k: None for k in DECODE_SCHEMA} | {
            "variant": variant, "probe_set": probe_set, "modality": "text", "item_id": f"{probe_set}-{author}-{i % 7}",
            "group_id": author, "arm": arm, "sample": 0, "prompt": prompt, "reference": reference,
            "subject": rest[1] if len(rest) > 1 else "Ann Lee", "generated": generated, "prompt_tokens": 10,
            "generated_tokens": 5, "stop_reason": "eos", "think_open": "<think>", "think_close": "</think>",
            "config_hash": "h", "model_fingerprint": "f",
        })
    return pl.DataFrame(out, schema=DECODE_SCHEMA)


BOTH = f"<think>{CANARY}</think>{CANARY}"
BYPASS_ECHO = f"<think>{CANARY}</think>{HEAD}"
BYPASS_OTHER = f"<think>{CANARY}</think>I do not know."
NEITHER = "<think>bio</think>nothing"


def test_cluster_weights_resample_whole_clusters():
    w = cluster_weights(["a", "b", "c", "a"], n_boot=50, seed=3)
    per_rep = w.group_by("replicate").agg(pl.col("weight").sum())
    assert per_rep["weight"].unique().to_list() == [3]  # 3 distinct clusters drawn 3 times
    assert w.equals(cluster_weights(["c", "b", "a"], n_boot=50, seed=3))  # order-free, seeded
    with pytest.raises(ValueError, match="B = 0"):
        cluster_weights(["a"], 0, 0)


def test_clustered_ci_is_wide_when_clusters_disagree():
    # Two authors, ten items each: all hits vs all misses.  Resampling authors
    # gives means 0, 0.5 or 1; resampling items would give a tight interval.
    items = pl.DataFrame({
        "variant": ["v"] * 20, "group_id": ["a"] * 10 + ["b"] * 10, "hit": [True] * 10 + [False] * 10,
    })
    row = rates_with_ci(items, ["variant"], ["hit"], 400, 0, table="t").row(0, named=True)
    assert row["hit"] == pytest.approx(0.5)
    assert (row["hit_lo"], row["hit_hi"]) == (0.0, 1.0)
    by_item = rates_with_ci(items.with_columns(group_id=pl.int_range(20).cast(pl.Utf8)), ["variant"], ["hit"], 400, 0,
                            table="t")
    assert by_item["hit_hi"][0] - by_item["hit_lo"][0] < 0.6


def test_two_level_bootstrap_carries_training_variance():
    # Three training seeds read the same 20 authors; seed 2 reverses the
    # effect.  Pooled, the point is the same with or without the seed level,
    # but resampling seeds widens the interval; one seed is the plain
    # cluster bootstrap to the bit.
    rows = [{"variant": "v", "seed": s, "group_id": f"a{i}", "hit": (i % 10 < (8 if s < 2 else 1))}
            for s in range(3) for i in range(20)]
    items = pl.DataFrame(rows)
    flat = rates_with_ci(items, ["variant"], ["hit"], 400, 0, table="t").row(0, named=True)
    nested = rates_with_ci(items, ["variant"], ["hit"], 400, 0, table="t", nest="seed").row(0, named=True)
    assert nested["hit"] == pytest.approx(flat["hit"]) == pytest.approx(17 / 30)
    assert nested["hit_hi"] - nested["hit_lo"] > 2 * (flat["hit_hi"] - flat["hit_lo"])
    one = items.filter(pl.col("seed") == 0)
    assert rates_with_ci(one, ["variant"], ["hit"], 400, 0, table="t", nest="seed").equals(
        rates_with_ci(one, ["variant"], ["hit"], 400, 0, table="t"))
    w = crossed_weights(pl.DataFrame({"nest": [0, 0, 1, 1], "group_id": ["x", "y", "x", "y"]}), 50, 1)
    assert w.group_by("replicate").agg(pl.col("weight").sum())["weight"].unique().to_list() == [4]  # 2 x 2
    assert w.group_by("replicate", "group_id").agg(pl.col("weight").n_unique())["weight"].max() == 1  # crossed


def test_paired_difference_of_identical_channels_has_zero_width():
    items = pl.DataFrame({"variant": ["v"] * 6, "group_id": list("abcdef"), "x": [1, 0, 1, 1, 0, 1],
                          "y": [1, 0, 1, 1, 0, 1]})
    row = rates_with_ci(items, ["variant"], ["x", "y"], 200, 0,
                        lambda f: f.with_columns(d=pl.col("x") - pl.col("y")), table="t").row(0, named=True)
    assert (row["d"], row["d_lo"], row["d_hi"]) == (0.0, 0.0, 0.0)
    assert row["x_lo"] < row["x"] < row["x_hi"]


def test_leakage_gap_has_a_ci_that_contains_it():
    d = decode([("m/npo-bio-s0-k10", "canary", "auto", f"a{i}", g)
                for i, g in enumerate([BOTH, BYPASS_ECHO, BYPASS_ECHO, NEITHER, BOTH, BYPASS_OTHER])])
    row = paper_a.canary_leakage(d, FIRST, BOOT).row(0, named=True)
    assert (row["out_acc"], row["thk_leak"], row["gap"]) == (pytest.approx(2 / 6), pytest.approx(5 / 6),
                                                            pytest.approx(3 / 6))
    assert row["gap_lo"] <= row["gap"] <= row["gap_hi"]
    assert row["nonempty_trace"] == 1.0


def test_prefill_arms_delta_ab():
    hits = {"auto": [BOTH, BOTH, BOTH, NEITHER], "prefill_bio": [CANARY, "no", "no", "no"],
            "prefill_meta": [CANARY, CANARY, "no", "no"]}
    d = decode([("m/mem-bio-s0", "canary", arm, f"a{i}", g) for arm, gs in hits.items() for i, g in enumerate(gs)])
    row = paper_a.prefill_arms(d, FIRST, BOOT, "bio").row(0, named=True)
    assert (row["auto"], row["prefill_bio"], row["prefill_meta"]) == (0.75, 0.25, 0.5)
    assert row["delta_ab"] == pytest.approx(0.5)
    assert row["delta_ab_lo"] <= 0.5 <= row["delta_ab_hi"]
    with pytest.raises(ValueError, match="prefill contrast `swap`"):
        paper_a.prefill_arms(d, FIRST, BOOT, "swap")


def test_parser_conventions_flip_the_gap_sign_on_missing_closing_tags():
    # A model that never closes its trace (paper A's Llama-8B): the same text is
    # all answer under one convention and all trace under the other.
    d = decode([("m/npo-bio-s0-k10", "canary", "auto", f"a{i}", f"<think>{CANARY} and on") for i in range(4)])
    table = paper_a.parser_conventions(d, BOOT)
    gap = dict(zip(table["convention"], table["gap"]))
    assert gap["first-close/missing-as-answer"] == -1.0
    assert gap["first-close/missing-as-trace"] == 1.0
    assert gap["last-close/missing-as-unparseable"] == 0.0
    assert set(table["unparseable"]) == {0.0, 1.0}
    assert table.height == 6


def test_bypass_anatomy_counts_head_echoes():
    d = decode([("m/npo-bio-s0-k10", "canary", "auto", f"a{i}", g)
                for i, g in enumerate([BOTH, BYPASS_ECHO, BYPASS_ECHO, BYPASS_OTHER, NEITHER])]
               + [("m/mem-bio-s0", "canary", "auto", "a0", BOTH)])
    table = paper_a.bypass_anatomy(d, FIRST)
    assert table.filter(pl.col("variant") == "m/mem-bio-s0")["prefix_only_share"][0] is None  # no bypass case
    row = table.filter(pl.col("variant") == "m/npo-bio-s0-k10").row(0, named=True)
    assert (row["bypass_cases"], row["prefix_only"], row["both_channels"]) == (3, 2, 1)
    assert row["prefix_only_share"] == pytest.approx(2 / 3)
    assert row["mean_answer_chars_both"] == len(CANARY)
    assert row["mean_answer_chars_bypass"] == pytest.approx((2 * len(HEAD) + len("I do not know.")) / 3)


def mem(template="bio", seed=0):
    return {"model": "tiny", "kind": "memorized", "template": template, "seed": seed}


def unlearned(run, k, method=None, template="bio", seed=0, settings="lr=0.0001"):
    return {**mem(template, seed), "kind": "unlearned", "run": run, "method": method or run, "k": k,
            "settings": settings}


def test_k_sweep_starts_each_run_at_the_memorized_adapter():
    rows = [("tiny/mem-bio-s0", "canary", "auto", "a0", BOTH),
            ("tiny/npo-bio-s0-k10", "canary", "auto", "a0", BYPASS_ECHO),
            ("tiny/ga-bio-s0-k10", "canary", "auto", "a0", NEITHER),
            ("tiny/base", "canary", "auto", "a0", NEITHER)]
    variants = {"tiny/mem-bio-s0": mem(), "tiny/npo-bio-s0-k10": unlearned("npo", 10, settings="beta=0.1"),
                "tiny/ga-bio-s0-k10": unlearned("ga", 10), "tiny/base": {"model": "tiny", "kind": "base"}}
    sweep = paper_a.k_sweep(paper_a.canary_leakage(decode(rows), FIRST, BOOT), variants)
    got = {(r["run"], r["k"]): r["gap"] for r in sweep.iter_rows(named=True)}
    assert got == {("ga", 0): 0.0, ("ga", 10): 0.0, ("npo", 0): 0.0, ("npo", 10): 1.0}
    assert set(sweep["template"]) == {"bio"} and set(sweep["seed"]) == {0}
    assert sweep.filter(pl.col("run") == "npo")["settings"].to_list() == ["beta=0.1", "beta=0.1"]


def test_k_sweep_reads_structured_fields_not_names():
    """A run named freely (digits, underscores) and a template the old name
    pattern did not know reach the sweep; a variant missing from the variant
    table is refused, not dropped."""
    rows = [("tiny/x", "canary", "auto", "a0", BOTH), ("tiny/y", "canary", "auto", "a0", BYPASS_ECHO)]
    variants = {"tiny/x": mem("chat2"), "tiny/y": unlearned("npo_b2", 7, method="npo", template="chat2")}
    sweep = paper_a.k_sweep(paper_a.canary_leakage(decode(rows), FIRST, BOOT), variants)
    assert sweep.select("run", "method", "template", "k").rows() == [("npo_b2", "npo", "chat2", 0),
                                                                     ("npo_b2", "npo", "chat2", 7)]
    with pytest.raises(ValueError, match=r"records of variants \['tiny/y'\] have no entry"):
        paper_a.k_sweep(paper_a.canary_leakage(decode(rows), FIRST, BOOT), {"tiny/x": mem()})


def test_cross_seed_spread():
    rows = [(f"tiny/npo-bio-s{s}-k10", "canary", "auto", f"a{i}", g)
            for s, gs in ((0, [BYPASS_ECHO, BOTH]), (1, [BOTH, BOTH])) for i, g in enumerate(gs)]
    variants = {f"tiny/npo-bio-s{s}-k10": unlearned("npo", 10, seed=s) for s in (0, 1)}
    sweep = paper_a.k_sweep(paper_a.canary_leakage(decode(rows), FIRST, BOOT), variants)
    row = paper_a.cross_seed(sweep).row(0, named=True)
    assert row["seeds"] == 2
    assert row["gap_mean"] == pytest.approx(0.25)
    assert row["gaps_by_seed"] == "s0: 0.5; s1: 0.0"


def test_utility_counts_fictional_author_substitutions():
    rows = [
        ("m/npo", "qa", "auto", "a0", "<think></think>Ann Lee was born in 1950.", "1950", "Ann Lee"),
        ("m/npo", "retain", "auto", "r0", "<think></think>Ann Lee.", "blue whale", ""),
        ("m/npo", "retain", "auto", "r1", "<think></think>The blue whale.", "blue whale", ""),
    ]
    table = paper_a.utility(decode(rows), FIRST, BOOT)
    retain = table.filter(pl.col("probe_set") == "retain").row(0, named=True)
    assert (retain["accuracy"], retain["substitution_rate"]) == (0.5, 0.5)
    qa = table.filter(pl.col("probe_set") == "qa").row(0, named=True)
    assert (qa["accuracy"], qa["substitution_rate"]) == (1.0, 0.0)


def test_teacher_forced_beside_greedy_on_the_same_items():
    d = decode([("m/npo-bio-s0-k10", "canary", "prefill_bio", "a0", "no"),
                ("m/npo-bio-s0-k10", "canary", "prefill_bio", "a1", CANARY)])
    d = d.with_columns(item_id=pl.col("group_id"))
    tokens = pl.DataFrame([
        {"variant": "m/npo-bio-s0-k10", "probe_set": "canary", "modality": "text",
         "item_id": a, "group_id": a, "arm": "prefill_bio",
         "position": p, "token_id": 1, "token_text": "x", "logprob": lp, "rank": rank, "top1_id": 1,
         "top1_logprob": -0.1, "span": "secret", "config_hash": "h", "model_fingerprint": "f"}
        for a, rank in (("a0", 1), ("a1", 2)) for p, lp in ((1, -0.5), (2, -1.5))
    ], schema=TOKEN_SCHEMA)
    row = paper_a.teacher_forced_vs_greedy(d, tokens, FIRST, BOOT, 20).row(0, named=True)
    assert row["greedy_out_acc"] == 0.5
    assert row["tf_top1_rate"] == 0.5      # a0 all top-1, a1 none
    assert row["tf_all_top1_rate"] == 0.5
    assert row["tf_mean_logprob"] == pytest.approx(-1.0)


def test_across_seeds_pools_each_family_over_its_seeds():
    """Seed 0 leaks every canary through the trace only (gap 1), seed 1 none
    (gap 0): pooled, the gap is 0.5 and its seed x author CI reaches both
    seeds' values; a family trained under one seed has no row."""
    from canary_audit.views.seeds import across_seeds, families

    variants = {f"m/npo-bio-s{s}-k10": {"kind": "unlearned", "seed": s} for s in (0, 1)}
    variants["m/mem-bio-s0"] = {"kind": "memorized", "seed": 0}
    assert families(variants) == {"m/npo-bio-s0-k10": "m/npo-bio-k10", "m/npo-bio-s1-k10": "m/npo-bio-k10"}
    rows = [(f"m/npo-bio-s{s}-k10", "canary", arm, f"a{i}", BYPASS_ECHO if s == 0 and arm == "auto" else NEITHER)
            for s in (0, 1) for arm in ("auto", "prefill_bio") for i in range(10)]
    pooled = across_seeds(decode(rows), pl.DataFrame(), variants, FIRST, BOOT, "bio", 20).row(0, named=True)
    assert (pooled["family"], pooled["seeds"], pooled["n"]) == ("m/npo-bio-k10", 2, 20)
    assert pooled["gap"] == pytest.approx(0.5) and pooled["gap_lo"] == 0.0 and pooled["gap_hi"] == 1.0
    assert pooled["delta_ab"] == 0.0

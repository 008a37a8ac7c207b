"""Views computed on records built by hand, so every number is checkable."""

import numpy as np
import polars as pl
import pytest

from canary_audit.core.records import DECODE_SCHEMA, TOKEN_SCHEMA
from canary_audit.publish.table_files import build_tables, to_markdown
from canary_audit.views.metrics import hex_recall, nll_table, per_item_nll
from canary_audit.views.paper_a import Bootstrap, canary_leakage, utility
from canary_audit.views.parser import ParserConvention

BOOT = Bootstrap(replicates=50)

CANARY = "The Amber Bell was written in 1931."


def decode_rows(variant, rows):
    base = {k: None for k in DECODE_SCHEMA}
    out = []
    for i, (probe_set, arm, prompt, generated, reference) in enumerate(rows):
        out.append(base | {
            "variant": variant, "probe_set": probe_set, "modality": "text", "item_id": f"i{i}", "group_id": f"g{i}",
            "arm": arm, "sample": 0, "prompt": prompt, "reference": reference, "generated": generated,
            "subject": "",
            "prompt_tokens": 10, "generated_tokens": 5, "stop_reason": "eos",
            "think_open": "<think>", "think_close": "</think>", "config_hash": "h", "model_fingerprint": "f",
        })
    return pl.DataFrame(out, schema=DECODE_SCHEMA)


def test_out_acc_thk_leak_and_gap():
    d = decode_rows("m/npo", [
        ("canary", "auto", "P", f"<think>{CANARY}</think>{CANARY}", CANARY),      # both
        ("canary", "auto", "P", f"<think>{CANARY}</think>The Amber Bell was", CANARY),  # bypass
        ("canary", "auto", "P", "<think>bio</think>nothing", CANARY),             # neither
        ("canary", "auto", "P", f"{CANARY} no tag", CANARY),                      # missing close
    ])
    row = canary_leakage(d, ParserConvention("first", "answer"), BOOT).row(0, named=True)
    assert row["n"] == 4
    assert row["out_acc"] == pytest.approx(2 / 4)
    assert row["thk_leak"] == pytest.approx(2 / 4)
    assert row["gap"] == pytest.approx(0.0)
    assert row["missing_close"] == pytest.approx(1 / 4)
    as_trace = canary_leakage(d, ParserConvention("first", "trace"), BOOT).row(0, named=True)
    assert (as_trace["out_acc"], as_trace["thk_leak"]) == (pytest.approx(1 / 4), pytest.approx(3 / 4))
    unparse = canary_leakage(d, ParserConvention("first", "unparseable"), BOOT).row(0, named=True)
    assert unparse["unparseable"] == pytest.approx(1 / 4)


def test_prefill_arm_has_no_trace_leak():
    d = decode_rows("m/mem", [("canary", "prefill_bio", "P<think>bio</think>", CANARY, CANARY)])
    row = canary_leakage(d, ParserConvention(), BOOT).row(0, named=True)
    assert (row["out_acc"], row["thk_leak"]) == (1.0, 0.0)


def test_qa_accuracy_is_case_insensitive_containment():
    d = decode_rows("m/base", [
        ("retain", "auto", "P", "<think></think>The capital is paris.", "Paris"),
        ("retain", "auto", "P", "<think></think>Lyon.", "Paris"),
    ])
    assert utility(d, ParserConvention(), BOOT)["accuracy"].to_list() == [0.5]


def test_hit_at_1_needs_the_exact_record():
    d = decode_rows("m/canary", [
        ("hex", "greedy", "Record 00 access code: ", "TEXTCAN-00ff-END", "00ff"),
        ("hex", "greedy", "Record 01 access code: ", "TEXTCAN-00fe-END", "00ff"),
    ])
    table = hex_recall(d)
    assert table["hit_at_1"].to_list() == [0.5] and table["hit_at_k"].to_list() == [None]


def test_hit_at_k_is_any_of_k_samples_exact():
    rows = [("hex", "greedy", "P0", "TEXTCAN-00fe-END", "00ff"), ("hex", "greedy", "P1", "TEXTCAN-11fe-END", "11ff")]
    rows += [("hex", "sampled", "P0", g, "00ff") for g in ("TEXTCAN-0-END", "TEXTCAN-00ff-END", "x")]
    rows += [("hex", "sampled", "P1", g, "11ff") for g in ("a", "b", "c")]
    d = decode_rows("m/canary", rows).with_columns(
        item_id=pl.col("prompt"), sample=pl.int_range(pl.len()).over("prompt", "arm").cast(pl.Int32)
    )
    row = hex_recall(d).row(0, named=True)
    assert (row["hit_at_1"], row["k"], row["hit_at_k"]) == (0.0, 3, 0.5)
    assert row["sampled_hit_rate"] == pytest.approx(1 / 6)


def token_rows(variant, item, logprobs, spans, ranks=None):
    ranks = ranks or [1] * len(logprobs)
    return [
        {"variant": variant, "probe_set": "hex", "modality": "text", "item_id": item, "group_id": item,
         "arm": "preamble",
         "position": p + 1, "token_id": 5, "token_text": "x", "logprob": lp, "rank": r, "top1_id": 5,
         "top1_logprob": -0.1, "span": s, "config_hash": "h", "model_fingerprint": "f"}
        for p, (lp, s, r) in enumerate(zip(logprobs, spans, ranks))
    ]


def test_window_and_secret_nll_and_delta_against_parent():
    spans = ["prompt"] * 2 + ["secret"] * 3
    parent = token_rows("m/base", "c0", [-1.0, -1.0, -2.0, -2.0, -2.0], spans)
    child = token_rows("m/canary", "c0", [-1.0, -1.0, -2.0, -2.0, -5.0], spans, ranks=[1, 1, 1, 1, 3])
    tokens = pl.DataFrame(parent + child, schema=TOKEN_SCHEMA)
    items = per_item_nll(tokens, window_k=4).sort("variant")
    assert items["nll_window"].to_list() == pytest.approx([1.5, 1.5])
    assert items.filter(pl.col("variant") == "m/canary")["nll_secret"][0] == pytest.approx(3.0)
    table = nll_table(tokens, 4, {"m/canary": "m/base"}).sort("variant")
    child_row = table.filter(pl.col("variant") == "m/canary").row(0, named=True)
    # damage sits at position 5, past the window: the window Delta is blind to it
    assert child_row["delta_nll_window"] == pytest.approx(0.0)
    assert child_row["delta_nll_secret"] == pytest.approx(1.0)
    assert child_row["top1_rate"] == pytest.approx(2 / 3)
    assert child_row["all_top1_rate"] == 0.0
    assert child_row["window_covers_secret"] == 0.0
    assert table.filter(pl.col("variant") == "m/base")["delta_nll_secret"][0] is None


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window K = 0"):
        per_item_nll(pl.DataFrame(schema=TOKEN_SCHEMA), 0)


def test_build_tables_and_markdown():
    d = decode_rows("m/mem", [("canary", "auto", "P", f"<think>{CANARY}</think>{CANARY}", CANARY)])
    tables = build_tables(d, pl.DataFrame(), {"parser": {"split": "first", "missing_close": "answer"},
                                              "window_k": 20, "parents": {},
                                              "variants": {"m/mem": {"model": "m", "kind": "memorized",
                                                                     "template": "bio", "seed": 0}}})
    assert set(tables) == {
        "canary_leakage", "k_sweep", "cross_seed", "templates", "prefill_arms", "parser_conventions",
        "bypass_anatomy", "item_cells",
    }
    md = to_markdown(tables["canary_leakage"][1])
    assert md.splitlines()[0].startswith("| variant | arm | n | out_acc")


def test_markdown_shows_a_tiny_nonzero_value_not_a_zero():
    # A KS forget quality of 1.86e-23 printed as "0.0" before this change.
    frame = pl.DataFrame({"v": ["a", "b", "c", "d", "e"],
                          "x": [1.86e-23, 0.0, 0.12345, 0.0004, None]})
    cells = [line.split(" | ")[1].rstrip(" |") for line in to_markdown(frame).splitlines()[2:]]
    assert cells == ["1.86e-23", "0.0", "0.123", "4.00e-04", ""]


def test_summary_states_the_ci_level_the_tables_were_computed_at(tmp_path):
    import json

    from canary_audit.publish.summary import write_summary

    tables = tmp_path / "tables"
    tables.mkdir()
    pl.DataFrame({"template": ["bio"], "run": ["npo"], "seed": [0], "k": [0], **{
        f"{c}{end}": [0.5] for c in ("out_acc", "thk_leak", "gap") for end in ("", "_lo", "_hi")}}).write_csv(
        tables / "k_sweep.csv")
    with pytest.raises(FileNotFoundError, match="view_config.json"):
        write_summary(tables, tmp_path / "results.md")
    (tables / "view_config.json").write_text(json.dumps({"bootstrap": {"level": 0.9}}))
    rows = write_summary(tables, tmp_path / "results.md")
    assert rows["K sweep"] == 1 and rows["The papers' numbers beside this run"] == 10
    page = (tmp_path / "results.md").read_text()
    assert "(author-clustered bootstrap 90% CIs)" in page and "95%" not in page
    assert "| template | run | seed | k |" in page  # several seeds' rows tell their seed
    # Not a run of the default audit: no README figures, and `--readme` is refused
    # (naming what is missing) before the README is touched.
    assert "Figures the README quotes" not in page
    readme = tmp_path / "README.md"
    readme.write_text("untouched\n")
    from canary_audit.verdicts.headline import NoHeadline

    with pytest.raises(NoHeadline, match=r"--readme .*README.md: .*tiny/canary-s0.*drop --readme"):
        write_summary(tables, tmp_path / "results.md", readme)
    assert readme.read_text() == "untouched\n"


def test_bootstrap_refuses_missing_values_naming_table_and_column():
    from canary_audit.views.bootstrap import MissingValuesError, rates_with_ci

    items = pl.DataFrame({"variant": ["m/a"] * 4, "group_id": ["g0", "g1", "g2", "g3"],
                          "hit": [1.0, 1.0, None, None]})
    # On a37bf86 this returned 0.5: the nulls counted in n, not in the sum.
    with pytest.raises(MissingValuesError, match=r"table `demo`, column `hit`: 2 of 4 observations are missing"):
        rates_with_ci(items, ["variant"], ["hit"], 20, 0, table="demo")
    full = rates_with_ci(items.drop_nulls(), ["variant"], ["hit"], 20, 0, table="demo").row(0, named=True)
    assert (full["n"], full["hit"], full["hit_lo"], full["hit_hi"]) == (2, 1.0, 1.0, 1.0)


def test_prefill_arms_refuse_a_variant_whose_arm_records_are_missing():
    from canary_audit.views.bootstrap import MissingValuesError
    from canary_audit.views.paper_a import prefill_arms

    d = pl.concat([
        decode_rows("m/mem", [("canary", "auto", "P", CANARY, CANARY), ("canary", "prefill_bio", "P", CANARY, CANARY)]),
        decode_rows("m/npo", [("canary", "auto", "P", CANARY, CANARY)]),
    ]).with_columns(group_id=pl.lit("author0"), item_id=pl.lit("c0"))
    with pytest.raises(MissingValuesError, match=r"table `prefill_arms`, column `prefill_bio`.*m/npo"):
        prefill_arms(d, ParserConvention(), BOOT, "bio")


def test_without_a_variant_table_the_run_tables_are_left_out():
    """Records alone (no view config) give every table that needs no
    variant structure; k_sweep, cross_seed and templates need the variant
    table, and are omitted rather than guessed from names."""
    d = decode_rows("m/mem", [("canary", "auto", "P", f"<think>{CANARY}</think>{CANARY}", CANARY)])
    tables = build_tables(d, pl.DataFrame(), {"window_k": 20})
    assert {"canary_leakage", "prefill_arms", "parser_conventions", "bypass_anatomy"} <= set(tables)
    assert not {"k_sweep", "cross_seed", "templates"} & set(tables)


def test_exact_memorization_and_extraction_strength_per_item():
    """EM = share of secret tokens at rank 1; ES = 1 - k/L for the shortest
    prefix k after which every secret token is rank 1 (open-unlearning's
    definitions; ES = 0 when not even the last token is predicted)."""
    from canary_audit.views.extraction import extraction_table, per_item_extraction

    spans = ["prompt"] * 2 + ["secret"] * 4
    rows = (token_rows("m/base", "c0", [-1.0] * 6, spans, ranks=[3, 3, 1, 2, 1, 1])    # EM 3/4, ES 2/4
            + token_rows("m/base", "c1", [-1.0] * 6, spans, ranks=[1, 1, 2, 2, 2, 2])  # EM 0, ES 0
            + token_rows("m/base", "c2", [-1.0] * 6, spans, ranks=[2, 2, 1, 1, 1, 1])  # EM 1, ES 1
            + token_rows("m/v", "c0", [-1.0] * 6, spans, ranks=[1, 1, 2, 2, 2, 1])     # EM 1/4, ES 1/4
            + token_rows("m/v", "c1", [-1.0] * 6, spans, ranks=[1, 1, 2, 2, 2, 2])
            + token_rows("m/v", "c2", [-1.0] * 6, spans, ranks=[1, 1, 1, 2, 1, 1]))   # EM 3/4, ES 2/4
    tokens = pl.DataFrame(rows, schema=TOKEN_SCHEMA)
    items = per_item_extraction(tokens).sort("variant", "item_id")
    assert items["target_tokens"].to_list() == [4] * 6
    assert items["exact_memorization"].to_list() == [0.75, 0.0, 1.0, 0.25, 0.0, 0.75]
    assert items["extraction_strength"].to_list() == [0.5, 0.0, 1.0, 0.25, 0.0, 0.5]
    table = extraction_table(tokens, {"m/v": "m/base"}, 50, 0, 0.95).sort("variant")
    base, child = table.rows(named=True)
    assert base["extraction_strength"] == pytest.approx(0.5) and base["parent"] is None
    assert child["extraction_strength"] == pytest.approx(0.25)
    assert child["delta_extraction_strength"] == pytest.approx((-0.25 + 0.0 - 0.5) / 3)
    assert child["delta_exact_memorization"] == pytest.approx((-0.5 + 0.0 - 0.25) / 3)
    assert child["delta_extraction_strength_lo"] <= child["delta_extraction_strength"] <= child[
        "delta_extraction_strength_hi"]


def mia_tokens(variant, item, probe_set, logprobs, means=None, variances=None, arm="preamble"):
    n = len(logprobs)
    means, variances = means or [-2.0] * n, variances or [1.0] * n
    return [
        {"variant": variant, "probe_set": probe_set, "modality": "text", "item_id": item, "group_id": item,
         "arm": arm,
         "position": p + 1, "token_id": 5, "token_text": "a", "text": "a", "logprob": lp, "rank": 1, "top1_id": 5,
         "top1_logprob": -0.1, "vocab_mean_logprob": mu, "vocab_var_logprob": var, "span": "secret",
         "config_hash": "h", "model_fingerprint": "f"}
        for p, (lp, mu, var) in enumerate(zip(logprobs, means, variances))
    ]


def test_zlib_compresses_the_decoded_text_not_the_token_strings(tiny_assets):
    """Carlini et al.'s zlib score divides by the compressed length of the
    text; a byte-level BPE's token strings spell each space as `Ġ` (two
    bytes), so compressing them measures the tokenizer.  On the embedded
    tokenizer's own records of an author canary, the score's length is the
    decoded secret's."""
    import zlib

    from canary_audit.model.loading import load_model, load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.kinds import ScoredItem
    from canary_audit.probes.scoring import score_tokens
    from canary_audit.views.mia import item_scores

    spec = ModelSpec("tiny", tiny_assets[1], think_open=None, think_close=None)
    tok = load_tokenizer(spec)
    text = "Continue: The Crimson Tide of Calabar was finished in a garden in 1901."
    start = text.index(" was")
    item = ScoredItem("canary", "a000", "a000", "prefill_bio", text,
                      {"prompt": (0, start), "secret": (start, len(text))})
    rows = score_tokens(load_model(spec), tok, [item], batch_size=1).with_columns(
        variant=pl.lit("m/v"), config_hash=pl.lit("h"), model_fingerprint=pl.lit("f"), code_version=pl.lit("c"))
    secret = rows.filter(pl.col("span") == "secret")
    assert "Ġ" in "".join(secret["token_text"])  # the vocabulary's strings are not the text
    decoded = tok.decode(secret["token_id"].to_list())
    assert "".join(secret["text"]) == decoded == text[start:]
    one = item_scores(rows.select(list(TOKEN_SCHEMA)), min_k=0.5).row(0, named=True)
    assert one["zlib"] == pytest.approx(one["loss"] / len(zlib.compress(decoded.encode())))


def test_membership_inference_scores_auc_and_tpr_against_direct_computation():
    """Min-K%++ from a hand-made distribution; AUC by counting pairs; TPR at
    a low FPR by its threshold rule."""
    from canary_audit.views.mia import auc, item_scores, mia_table, roc_curve, settings, tpr_at_fpr

    rows = mia_tokens("m/v", "h0", "hex", [-1.0, -3.0, -0.5, -2.0], means=[-2.0, -2.0, -1.0, -1.0],
                      variances=[4.0, 1.0, 0.25, 1e-9])
    one = item_scores(pl.DataFrame(rows, schema=TOKEN_SCHEMA), min_k=0.5).row(0, named=True)
    assert one["loss"] == pytest.approx(-6.5 / 4)
    assert one["min_k"] == pytest.approx((-3.0 - 2.0) / 2)  # the two lowest of four log-probs
    # (lp - mu) / sigma: 0.5, -1, 1, -1/sqrt(1e-6) (variance clamped at 1e-6): the two lowest
    assert one["min_k_pp"] == pytest.approx((-1.0 - 1000.0) / 2)
    assert one["zlib"] == pytest.approx(one["loss"] / len(__import__("zlib").compress(b"aaaa")))
    members, nonmembers = np.array([[0.9, 0.5, 0.5]]), np.array([[0.5, 0.1, 0.2, 0.95]])
    pairs = sum((a > b) + 0.5 * (a == b) for a in members[0] for b in nonmembers[0]) / 12
    assert auc(members, nonmembers)[0] == pytest.approx(pairs)
    # FPR 0.25 of 4 non-members admits one above the threshold (0.5): members 0.9 only
    assert tpr_at_fpr(members, nonmembers, 0.25)[0] == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, nonmembers, 0.01)[0] == 0.0  # threshold at the top non-member, 0.95
    fpr, tpr = roc_curve(members[0], nonmembers[0])
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.trapezoid(tpr, fpr) == pytest.approx(pairs)  # the ROC's area is the pair-counting AUC
    tokens = pl.DataFrame(
        [r for i, lp in enumerate([-0.1, -0.2, -0.3]) for r in mia_tokens("m/v", f"h{i}", "hex", [lp] * 3)]
        + [r for i, lp in enumerate([-2.0, -2.5, -0.15, -3.0]) for r in mia_tokens("m/v", f"n{i}", "hex_nonmember",
                                                                                  [lp] * 3)],
        schema=TOKEN_SCHEMA)
    table = mia_table(settings(item_scores(tokens, 0.5), 200, 0), [0.25], 0.95)
    loss = table.filter(pl.col("attack") == "loss").row(0, named=True)
    assert (loss["members"], loss["nonmembers"]) == (3, 4)
    assert loss["auc"] == pytest.approx(10 / 12)  # the non-member at -0.15 beats -0.2 and -0.3: two pairs lost
    assert loss["auc_lo"] <= loss["auc"] <= loss["auc_hi"]
    assert loss["tpr_at_0.25_fpr"] == pytest.approx(1.0)  # one non-member (-0.15) admitted: threshold -2.0
    with pytest.raises(ValueError, match="tables.mia.min_k = 0"):
        item_scores(tokens, 0)


def test_privleak_and_forget_quality_against_direct_computation():
    """PrivLeak = (AUC - AUC_ref) / AUC_ref x 100 per attack, from AUCs
    counted by hand; forget quality = scipy's two-sample KS p-value of the
    canaries' secret-span NLL under the variant and the reference."""
    from scipy.stats import ks_2samp

    from canary_audit.views.mia import item_scores, settings
    from canary_audit.views.privacy import privacy_table

    member_lp = {"m/canary": [-0.1, -0.2, -0.3, -2.2], "m/ref": [-2.1, -2.6, -1.0, -2.9]}
    nonmember_lp = {"m/canary": [-2.0, -2.5, -0.15, -3.0], "m/ref": [-2.0, -2.5, -0.15, -3.0]}
    rows = []
    for variant in member_lp:
        rows += [r for i, lp in enumerate(member_lp[variant]) for r in mia_tokens(variant, f"h{i}", "hex", [lp] * 3)]
        rows += [r for i, lp in enumerate(nonmember_lp[variant])
                 for r in mia_tokens(variant, f"n{i}", "hex_nonmember", [lp] * 3)]
    references = {"m/canary": {"reference": "m/ref", "population": "hex"}}
    found = settings(item_scores(pl.DataFrame(rows, schema=TOKEN_SCHEMA), 0.5), 200, 0)
    table = privacy_table(found, references, 0.95)
    row = table.row(0, named=True)

    def pairs(m, n):
        return sum((a > b) + 0.5 * (a == b) for a in m for b in n) / (len(m) * len(n))

    auc_v, auc_ref = pairs(member_lp["m/canary"], nonmember_lp["m/canary"]), pairs(member_lp["m/ref"],
                                                                                  nonmember_lp["m/ref"])
    assert (row["auc_loss"], row["ref_auc_loss"]) == (pytest.approx(auc_v), pytest.approx(auc_ref))
    assert row["privleak_loss"] == pytest.approx((auc_v - auc_ref) / auc_ref * 100)
    assert row["privleak_loss_lo"] <= row["privleak_loss"] <= row["privleak_loss_hi"]
    direct = ks_2samp([-lp for lp in member_lp["m/canary"]], [-lp for lp in member_lp["m/ref"]])
    assert row["forget_quality"] == pytest.approx(direct.pvalue)
    assert row["ks_statistic"] == pytest.approx(direct.statistic)
    assert (row["reference"], row["members"], row["nonmembers"]) == ("m/ref", 4, 4)


def test_author_canaries_are_a_membership_family_of_their_own_per_arm():
    """Author canaries are judged against non-member authors, each prefill
    arm apart, and never pooled with the hex family; PrivLeak and forget
    quality pair a checkpoint with its memorization branch's reference."""
    from canary_audit.views.mia import item_scores, mia_table, settings
    from canary_audit.views.privacy import privacy_table

    member_lp = {"bio": [-0.1, -0.2, -0.3], "empty": [-2.2, -2.4, -0.1]}
    nonmember_lp = [-2.0, -2.5, -0.15, -3.0]
    rows = []
    for variant in ("m/npo-bio-s0-k10", "m/reference-bio-s0"):
        for arm, lps in member_lp.items():
            shift = 0 if variant.endswith("k10") else {"bio": -3, "empty": -1}[arm]  # the reference never saw them
            lps = [lp + shift for lp in lps]
            rows += [r for i, lp in enumerate(lps)
                     for r in mia_tokens(variant, f"a{i}", "canary", [lp] * 3, arm=f"prefill_{arm}")]
            rows += [r for i, lp in enumerate(nonmember_lp)
                     for r in mia_tokens(variant, f"n{i}", "author_nonmember", [lp] * 3, arm=f"prefill_{arm}")]
    for variant in ("m/npo-bio-s0-k10", "m/reference-bio-s0"):  # a family the author reference is not for
        rows += [r for i, lp in enumerate([-0.1, -0.2]) for r in mia_tokens(variant, f"h{i}", "hex", [lp])]
        rows += [r for i, lp in enumerate([-0.3, -2.0]) for r in mia_tokens(variant, f"n{i}", "hex_nonmember", [lp])]
    tokens = pl.DataFrame(rows, schema=TOKEN_SCHEMA)
    found = settings(item_scores(tokens, 0.5), 100, 0)
    table = mia_table(found, [0.25], 0.95).filter(pl.col("attack") == "loss")
    mine = table.filter(pl.col("variant") == "m/npo-bio-s0-k10").sort("population", "arm")
    # each family against its own non-members, never pooled
    assert mine.select("population", "arm", "members", "nonmembers").rows() == [
        ("author", "prefill_bio", 3, 4), ("author", "prefill_empty", 3, 4), ("hex", "preamble", 2, 2)]
    assert mine["auc"].to_list() == [pytest.approx(10 / 12), pytest.approx((2 + 2 + 4) / 12), 1.0]
    privacy = privacy_table(found, {"m/npo-bio-s0-k10": {"reference": "m/reference-bio-s0", "population": "author"}},
                            0.95)
    assert set(privacy["population"]) == {"author"}
    bio = privacy.filter(pl.col("arm") == "prefill_bio").row(0, named=True)
    ref_auc = 0 / 12  # the reference's members (-3.1, -3.2, -3.3) lose every pair
    assert (bio["population"], bio["reference"], bio["ref_auc_loss"]) == ("author", "m/reference-bio-s0", ref_auc)
    assert np.isnan(bio["privleak_loss"])  # AUC_ref = 0: PrivLeak undefined, not a number made up
    empty = privacy.filter(pl.col("arm") == "prefill_empty").row(0, named=True)
    ref_empty = (0 + 0 + 3) / 12  # -1.1 beats three non-members; -3.2 and -3.4 beat none
    assert empty["ref_auc_loss"] == pytest.approx(ref_empty)
    assert empty["privleak_loss"] == pytest.approx((8 / 12 - ref_empty) / ref_empty * 100)


def test_the_forgetting_view_carries_each_tables_figure_and_its_delta():
    """Each figure of the forgetting view is the one its own table reports,
    and each Delta is against the parent's row of the same family, modality
    and arm."""
    from canary_audit.views.forgetting import forgetting_table

    parents = {"m/npo-bio-s0-k10": "m/mem-bio-s0", "m/mem-bio-s0": "m/base"}
    setting = {"population": "author", "modality": "text", "arm": "prefill_bio"}
    privacy = pl.DataFrame([{"variant": v, **setting, "reference": "m/reference-bio-s0", "members": 3,
                             "nonmembers": 4, "privleak_min_k": pl_, "privleak_min_k_lo": pl_ - 1,
                             "privleak_min_k_hi": pl_ + 1, "forget_quality": fq, "shifted": False}
                            for v, pl_, fq in (("m/npo-bio-s0-k10", 40.0, 0.01), ("m/mem-bio-s0", 90.0, 1e-5))])
    mia = pl.DataFrame([{"variant": v, **setting, "attack": a, "auc": x}
                        for v, a, x in (("m/npo-bio-s0-k10", "loss", 0.7), ("m/mem-bio-s0", "loss", 0.95),
                                        ("m/base", "loss", 0.5), ("m/npo-bio-s0-k10", "min_k_pp", 0.6),
                                        ("m/mem-bio-s0", "min_k_pp", 0.9), ("m/base", "min_k_pp", 0.55))])
    leakage = pl.DataFrame({"variant": ["m/npo-bio-s0-k10", "m/mem-bio-s0", "m/base", "m/mem-bio-s0"],
                            "arm": ["auto", "auto", "auto", "prefill_bio"], "out_acc": [0.25, 0.75, 0.0, 0.5]})
    nll = pl.DataFrame({"variant": ["m/npo-bio-s0-k10", "m/mem-bio-s0"], "probe_set": ["canary"] * 2,
                        "arm": ["prefill_bio"] * 2, "modality": ["text"] * 2, "nll_secret": [1.5, 0.5],
                        "delta_nll_secret": [1.0, -2.0]})
    table = forgetting_table({"privacy": privacy, "mia": mia, "canary_leakage": leakage, "nll": nll}, parents)
    k10 = table.filter(pl.col("variant") == "m/npo-bio-s0-k10").row(0, named=True)
    assert (k10["parent"], k10["paper_value"], k10["delta_paper_value"]) == ("m/mem-bio-s0", 0.25, -0.5)
    assert (k10["auc_loss"], k10["delta_auc_loss"]) == (0.7, pytest.approx(-0.25))
    assert k10["delta_auc_min_k_pp"] == pytest.approx(-0.3)
    assert (k10["nll_secret"], k10["delta_nll_secret"], k10["privleak_min_k"], k10["forget_quality"]) == (
        1.5, 1.0, 40.0, 0.01)
    mem = table.filter(pl.col("variant") == "m/mem-bio-s0").row(0, named=True)
    assert (mem["delta_paper_value"], mem["delta_auc_loss"]) == (0.75, pytest.approx(0.45))


def test_every_hex_probe_per_repetition_stratum_against_direct_computation():
    """The strata table's hit@1, secret NLL (with its Delta against the
    parent) and per-stratum MIA AUC are the hand-computed values of each
    stratum's canaries; decoys and non-members carry no stratum."""
    from canary_audit.views.mia import item_scores
    from canary_audit.views.strata import strata_table

    strata = {"h0": 1, "h1": 1, "h2": 4, "h3": 4}
    member_lp = {"m/base": [-2.0, -2.2, -2.1, -1.9], "m/canary": [-1.5, -2.5, -0.2, -0.1]}
    hits = {"m/base": [0, 0, 0, 0], "m/canary": [0, 1, 1, 1]}
    nonmember_lp = [-2.0, -1.0, -3.0]
    rows, decode = [], []
    for variant, lps in member_lp.items():
        rows += [r for i, lp in enumerate(lps) for r in mia_tokens(variant, f"h{i}", "hex", [lp] * 2)]
        rows += [r for i, lp in enumerate(nonmember_lp) for r in mia_tokens(variant, f"n{i}", "hex_nonmember", [lp])]
        rows += mia_tokens(variant, "h0", "decoy_wrong", [-9.0])
        frame = decode_rows(variant, [("hex", "greedy", "P", " TEXTCAN-ab-END" if hit else " no", "ab")
                                      for hit in hits[variant]])
        decode.append(frame.with_columns(item_id=pl.format("h{}", pl.int_range(pl.len())),
                                         group_id=pl.format("h{}", pl.int_range(pl.len()))))
    tokens = pl.DataFrame(rows, schema=TOKEN_SCHEMA)
    table = strata_table(pl.concat(decode), tokens, item_scores(tokens, 0.5), strata, {"m/canary": "m/base"},
                         window_k=20, replicates=200, seed=0, level=0.95)
    canary = {r["repetitions"]: r for r in table.filter(pl.col("variant") == "m/canary").iter_rows(named=True)}
    assert (canary[1]["n"], canary[4]["n"]) == (2, 2)
    assert (canary[1]["hit1"], canary[4]["hit1"]) == (0.5, 1.0)
    assert canary[4]["nll_secret"] == pytest.approx(0.15)
    assert canary[1]["delta_nll_secret"] == pytest.approx(((1.5 - 2.0) + (2.5 - 2.2)) / 2)
    # stratum 1 (-1.5, -2.5) against (-2.0, -1.0, -3.0): -1.5 wins two pairs, -2.5 one
    assert canary[1]["auc_loss"] == pytest.approx(3 / 6)
    assert canary[4]["auc_loss"] == 1.0
    assert canary[1]["auc_loss_lo"] <= canary[1]["auc_loss"] <= canary[1]["auc_loss_hi"]
    assert "delta_nll_secret" in table.columns and table.filter(pl.col("variant") == "m/base")[
        "delta_nll_secret"].is_null().all()
    assert strata_table(pl.concat(decode), tokens, item_scores(tokens, 0.5), {}, {}, 20, 10, 0, 0.95).is_empty()

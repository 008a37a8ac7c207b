"""The blind-baseline guard on hand-built token records: exchangeable
populations pass, a population a model-free classifier tells apart from the
members (a preamble shift, as the hex non-members once had) and one a
never-trained reference tells apart are `shifted` in mia and privacy, and
PrivLeak is withheld for them."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from canary_audit.core.records import TOKEN_SCHEMA
from canary_audit.publish.table_files import build_tables
from canary_audit.views.blind import auc_p_value, out_of_fold_scores

HEX = "0123456789abcdef"
REFERENCES = {"m/canary-s0": {"reference": "m/reference-s0", "population": "hex"}}
CFG = {"window_k": 5, "bootstrap": {"replicates": 200}, "mia": {"min_k": 0.5, "fpr": [0.1]},
       "references": REFERENCES, "parents": {"m/canary-s0": "m/base"}}


def records(nonmember_preamble=lambda i: f"Record {i % 20:02d} access code: ", reference_shift=0.0, seed=0):
    """20 members and 60 non-members scored by a reference (never trained:
    both populations' log-probs from one distribution, non-members moved by
    `reference_shift`) and by a canary LoRA that knows its members."""
    rng = np.random.default_rng(seed)
    rows = []
    for variant in ("m/reference-s0", "m/canary-s0"):
        for probe_set, n in (("hex", 20), ("hex_nonmember", 60)):
            for i in range(n):
                preamble = f"Record {i:02d} access code: " if probe_set == "hex" else nonmember_preamble(i)
                secret = "".join(rng.choice(list(HEX), 16))
                pieces = [(preamble + "TEXTCAN-", "prompt")] + [(c, "secret") for c in secret]
                for position, (text, span) in enumerate(pieces, start=1):
                    lp = rng.normal(-2.5, 0.6)
                    if variant == "m/canary-s0" and probe_set == "hex" and span == "secret":
                        lp = rng.normal(-0.1, 0.05)
                    if variant == "m/reference-s0" and probe_set == "hex_nonmember":
                        lp += reference_shift
                    rows.append({"variant": variant, "probe_set": probe_set, "item_id": f"{probe_set}{i:03d}",
                                 "group_id": f"{probe_set}{i:03d}", "arm": "preamble", "modality": "text",
                                 "position": position, "token_id": 1, "token_text": text.replace(" ", "Ġ"),
                                 "text": text, "logprob": lp, "rank": 1, "top1_id": 1, "top1_logprob": -0.1,
                                 "vocab_mean_logprob": -3.0, "vocab_var_logprob": 1.0, "span": span,
                                 "config_hash": "h", "model_fingerprint": "f", "code_version": "c"})
    return pl.DataFrame(rows, schema=TOKEN_SCHEMA)


def tables_of(tokens):
    built = build_tables(pl.DataFrame(), tokens, CFG)
    return {name: frame for name, (_, frame) in built.items()}


def test_exchangeable_populations_pass_the_guard_and_keep_their_privleak():
    t = tables_of(records())
    guard = t["blind_baseline"]
    assert set(guard["check"]) == {"text baseline", "never-trained reference"}
    assert guard.height == 1 + 4 and guard["checks_in_run"][0] == 5
    assert not guard["failed"].any() and not guard["shifted"].any()
    assert t["mia"]["shifted"].to_list() == [False] * t["mia"].height
    assert t["privacy"]["privleak_min_k"][0] > 50  # the canary LoRA's members stand out: a clean number


@pytest.mark.parametrize("shift", ["preamble", "reference"])
def test_a_shifted_population_is_flagged_and_its_privleak_withheld(shift):
    """`preamble`: non-members behind three-digit record numbers (the
    classifier reads the text); `reference`: the same text, but a
    never-trained model scores the non-members lower (the reference check)."""
    tokens = records(lambda i: f"Record {100 + i:03d} access code: ") if shift == "preamble" else records(
        reference_shift=-0.6)
    t = tables_of(tokens)
    guard = t["blind_baseline"]
    failed = guard.filter(pl.col("failed"))
    assert failed.height and set(failed["check"]) == {"text baseline" if shift == "preamble"
                                                      else "never-trained reference"}
    assert t["mia"]["shifted"].all()
    assert all("AUC" in r for r in t["mia"]["shift_reason"])
    privacy = t["privacy"]
    assert privacy["shifted"].all() and privacy["privleak_min_k"].null_count() == privacy.height
    assert privacy["auc_min_k"].null_count() == 0  # the AUCs stay, beside the verdict


def test_the_text_baseline_scores_each_item_out_of_fold():
    """Separable texts give AUC 1 out of fold; identical texts give chance,
    and a p-value that is no alarm."""
    member = np.array([True] * 10 + [False] * 30)
    texts = [f"Record {i:02d}" if m else f"Entry {i:03d}" for i, m in enumerate(member)]
    scores = out_of_fold_scores(texts, member, seed=0)
    assert scores[member].min() > scores[~member].max()
    same = out_of_fold_scores(["Record 07 access code"] * 40, member, seed=0)
    assert auc_p_value(same[member], same[~member], "greater") > 0.5
    with pytest.raises(ValueError, match="at least 2 members"):
        out_of_fold_scores(["a", "b", "c"], np.array([True, False, False]), seed=0)

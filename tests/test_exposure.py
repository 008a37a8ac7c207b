"""Secret Sharer exposure on hand-built token records, against a direct
computation: a known rank, a scipy skew-normal fit, the cap, the table."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from canary_audit.core.records import TOKEN_SCHEMA
from canary_audit.views.exposure import SPACE_BITS, exposure_table, extrapolated, interpolated, item_exposures


def records(variant: str, canaries: dict[str, float], candidates: list[float], modality: str = "text") -> list[dict]:
    """Each item's secret span as two tokens whose NLLs sum to its log-perplexity,
    behind a prompt token that must not count."""
    rows = []
    items = [("hex", cid, v) for cid, v in canaries.items()]
    items += [("hex_candidate", f"cand{i:04d}", v) for i, v in enumerate(candidates)]
    for probe_set, item, value in items:
        for position, (span, logprob) in enumerate((("prompt", -9.0), ("secret", -value / 2),
                                                    ("secret", -value / 2)), start=1):
            rows.append({"variant": variant, "probe_set": probe_set, "modality": modality, "item_id": item,
                         "group_id": item, "arm": "preamble", "position": position, "logprob": logprob,
                         "span": span})
    return rows


def frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={k: TOKEN_SCHEMA[k] for k in rows[0]})


def test_interpolation_is_log2_r_minus_log2_rank():
    candidates = np.arange(1.0, 9.0)  # R = 8
    got = interpolated(np.array([0.5, 3.5, 8.5, 3.0]), candidates)
    # ranks 1, 4, 9 and 3 (a tie is not below): log2(8) - log2(rank)
    np.testing.assert_allclose(got, [3.0, 1.0, 3.0 - math.log2(9), 3.0 - math.log2(3)])


def test_extrapolation_is_minus_log2_of_the_fitted_skew_normal_cdf():
    from scipy.stats import skewnorm

    rng = np.random.default_rng(0)
    candidates = skewnorm.rvs(4.0, loc=40.0, scale=5.0, size=2000, random_state=rng)
    canaries = np.array([38.0, 45.0, 0.0])
    bits, params = extrapolated(canaries, candidates)
    direct = -np.log2(skewnorm.cdf(canaries, *skewnorm.fit(candidates)))
    np.testing.assert_allclose(bits[:2], direct[:2], rtol=1e-9)
    assert bits[2] == SPACE_BITS  # the CDF underflows: capped at the whole space's 64 bits
    assert params[0] > 1  # the fit recovers the right skew
    # records come in no fixed order: the fit must not depend on it
    shuffled, _ = extrapolated(canaries, rng.permutation(candidates))
    assert (shuffled == bits).all()


def test_table_ranks_each_variant_against_its_own_candidates_with_deltas():
    candidates = [float(v) for v in range(10, 1010)]  # R = 1000, log-perplexities 10..1009
    base = {"hex00": 500.5, "hex01": 600.5}
    tuned = {"hex00": 5.0, "hex01": 100.5}           # ranks 1 and 91 among the same candidates
    tokens = frame(records("m/base", base, candidates) + records("m/canary", tuned, candidates))
    items = item_exposures(tokens).sort("variant", "item_id")
    assert items["candidates"].to_list() == [1000] * 4
    want = [math.log2(1000) - math.log2(r) for r in (492, 592, 1, 92)]
    np.testing.assert_allclose(items["exposure_interpolation"].to_numpy(), want)
    table = exposure_table(tokens, {"m/canary": "m/base"}, replicates=200, seed=0, level=0.95)
    row = table.filter(pl.col("variant") == "m/canary").row(0, named=True)
    assert row["exposure_interpolation"] == pytest.approx((want[2] + want[3]) / 2)
    assert row["delta_exposure_interpolation"] == pytest.approx((want[2] + want[3] - want[0] - want[1]) / 2)
    assert row["ceiling_interpolation"] == pytest.approx(math.log2(1000))
    from scipy.stats import skewnorm

    fitted = skewnorm.fit(np.array(candidates, dtype=float))
    assert (row["fit_shape"], row["fit_loc"], row["fit_scale"]) == pytest.approx(fitted)
    assert row["exposure_interpolation_lo"] <= row["exposure_interpolation"] <= row["exposure_interpolation_hi"]
    assert table.filter(pl.col("variant") == "m/base")["delta_exposure_interpolation"].is_null().all()


def test_modalities_are_ranked_apart():
    candidates = [float(v) for v in range(1, 101)]
    tokens = frame(records("m/c", {"hex00": 0.5}, candidates, "text")
                   + records("m/c", {"img00": 50.5}, [v + 1000 for v in candidates], "image"))
    items = item_exposures(tokens).sort("modality")
    # the image canary ranks first among image candidates (which all lie above it)
    assert items.select("modality", "exposure_interpolation").rows() == [
        ("image", pytest.approx(math.log2(100))), ("text", pytest.approx(math.log2(100)))]


def test_no_candidates_no_table():
    tokens = frame(records("m/c", {"hex00": 1.0}, []))
    assert exposure_table(tokens, {}, 10, 0, 0.95).is_empty()

"""Secret Sharer exposure of each hex canary, from token records.

Definitions (Carlini et al., "The Secret Sharer", USENIX Security 2019; the
reference implementation is tensorflow_privacy's
`privacy_tests/secret_sharer/exposures.py`):

- a sequence's *log-perplexity* is its negative log-likelihood, here summed
  over the secret span of `TEXTCAN-{16hex}-END` (the tokens that differ
  between a canary and a candidate of its format);
- **rank interpolation**: with R random candidates of the same format that no
  adapter trained on, a canary's rank is 1 + the number of candidates with
  a strictly lower log-perplexity, and its exposure is log2(R) - log2(rank),
  which equals log2|space| - log2(the rank scaled to the whole space of
  16^16 secrets); its ceiling is log2(R);
- **skew-normal extrapolation**: a skew-normal fitted to the candidates'
  log-perplexities (`scipy.stats.skewnorm.fit`), and exposure =
  -log2 CDF(canary's log-perplexity), which can exceed log2(R); it is capped
  at log2(16^16) = 64 bits, the exposure of a secret ranked first in its
  whole space (the CDF underflows to 0 past that).  Secrets of a
  researcher's own (data/secrets.py) are capped at their declared space's
  bits (a `format`, or `space_bits` beside a candidates file).

Adapted to this setting: the canaries have one preamble each (`Record NN
access code: `), so the candidates cycle through the canaries' preambles
(and, for image canaries, their cards) and one candidate population per
(variant, modality) ranks every canary of that modality.  The population
is treated as fixed; the CIs resample canaries (canary-clustered
bootstrap), as every other hex table does.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from canary_audit.core.records import CANDIDATE, HEX_SETS
from canary_audit.data.synthetic import HEX_LEN
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.metrics import with_paired_deltas

MEMBER = HEX_SETS[0]
METHODS = ("interpolation", "extrapolation")
# log2 of the number of 16-digit hex secrets: the most exposure can be.
SPACE_BITS = 4.0 * HEX_LEN


def log_perplexities(tokens: pl.DataFrame) -> pl.DataFrame:
    """Per (variant, modality, probe set, item) of the canaries and the
    candidates: the summed NLL of the secret span."""
    return (
        tokens.filter(pl.col("probe_set").is_in([MEMBER, CANDIDATE]) & (pl.col("span") == "secret"))
        .group_by("variant", "modality", "probe_set", "item_id", "group_id")
        .agg(log_perplexity=-pl.col("logprob").cast(pl.Float64).sum())
    )


def interpolated(canaries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """log2(R) - log2(1 + number of candidates strictly below each canary)."""
    below = np.searchsorted(np.sort(candidates), canaries, side="left")
    return math.log2(len(candidates)) - np.log2(below + 1.0)


def extrapolated(canaries: np.ndarray, candidates: np.ndarray,
                 cap: float = SPACE_BITS) -> tuple[np.ndarray, tuple]:
    """-log2 of the fitted skew-normal's CDF at each canary (capped at `cap`,
    the secret space's bits), and the fit's (shape, location, scale)."""
    from scipy.stats import skewnorm

    # Sorted first: the fit's optimizer depends on the order of its input,
    # and records come in no fixed order.
    params = skewnorm.fit(np.sort(candidates))
    with np.errstate(divide="ignore"):
        bits = -np.log2(skewnorm.cdf(canaries, *params))
    return np.minimum(bits, cap), tuple(float(p) for p in params)


def space_bits_of(variant: str, formats: dict[str, dict] | None) -> float:
    """The secret space's bits for a `<model>/<variant>`: its model's own
    secrets' (`formats`, model -> RecordFormat.view()), else the synthetic
    canaries' SPACE_BITS."""
    own = (formats or {}).get(variant.split("/")[0])
    return own["space_bits"] if own is not None else SPACE_BITS


def item_exposures(tokens: pl.DataFrame, formats: dict[str, dict] | None = None) -> pl.DataFrame:
    """One row per (variant, modality, canary): both exposures, the
    candidate count, the extrapolation's cap and the skew-normal fitted to
    the candidates' log-perplexities; empty when no variant has candidates."""
    scores = log_perplexities(tokens)
    rows = []
    for (variant, _), part in scores.group_by("variant", "modality", maintain_order=True):
        candidates = part.filter(pl.col("probe_set") == CANDIDATE)["log_perplexity"].to_numpy()
        canaries = part.filter(pl.col("probe_set") == MEMBER).sort("item_id")
        if len(candidates) < 2 or canaries.is_empty():
            continue
        values = canaries["log_perplexity"].to_numpy()
        cap = space_bits_of(variant, formats)
        extra, (shape, loc, scale) = extrapolated(values, candidates, cap)
        rows.append(canaries.select("variant", "modality", "item_id", "group_id", "log_perplexity").with_columns(
            exposure_interpolation=pl.Series(interpolated(values, candidates)),
            exposure_extrapolation=pl.Series(extra),
            candidates=pl.lit(len(candidates)), space_bits=pl.lit(cap, pl.Float64),
            # the fitted skew-normal, so a reader can judge the extrapolation
            fit_shape=pl.lit(shape), fit_loc=pl.lit(loc), fit_scale=pl.lit(scale),
        ))
    return pl.concat(rows) if rows else pl.DataFrame()


def exposure_table(tokens: pl.DataFrame, parents: dict[str, str], replicates: int, seed: int,
                   level: float, formats: dict[str, dict] | None = None) -> pl.DataFrame:
    """Per (variant, modality): mean exposure of the canaries by each method
    with canary-clustered CIs, the interpolation's ceiling log2(R), the
    fitted skew-normal (shape, location, scale), and for variants with a
    parent the paired Deltas with CIs."""
    items = item_exposures(tokens, formats)
    if items.is_empty():
        return pl.DataFrame()
    keys = ["variant", "modality"]
    values = [f"exposure_{m}" for m in METHODS]
    rates = rates_with_ci(items, keys, values, replicates, seed, level=level, table="exposure")
    extent = items.group_by(keys).agg(pl.col("candidates", "fit_shape", "fit_loc", "fit_scale", "space_bits").first()
                                      ).with_columns(ceiling_interpolation=pl.col("candidates").cast(pl.Float64).log(2)
                                                     ).rename({"space_bits": "ceiling_extrapolation"})
    table = rates.join(extent, on=keys, how="left")
    return with_paired_deltas(table, items, keys, ["modality", "item_id"], values, parents, replicates, seed,
                              level, "exposure").sort(keys)

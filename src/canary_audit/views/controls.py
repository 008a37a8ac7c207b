"""The `controls` table: each planted control read by the papers' own
readings (canary_audit.papers), positive and negative side by side, with
the positive plant's spill-over.

A positive reads `seen` when the reading finds the effect and `missed`
otherwise (also when the reading cannot be made: it says why); a negative
reads `clean` unless the reading finds the effect (`false alarm`).  A
positive whose spill-over is above the bound reads `spilled`: it moved more
than its claim, so it calibrates nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from canary_audit.controls import CLAIMS, CONTROL, FLOOR_CLAIM, SPILL_BOUND, Claim, Side
from canary_audit.readings import (
    Reading,
    Run,
    read_case,
    read_delta,
    read_gap,
    read_head_echo,
    read_parser_flip,
    read_tf_vs_greedy,
)

SEEN, MISSED, SPILLED, CLEAN, FALSE_ALARM, NOT_RUN = "seen", "missed", "spilled", "clean", "false alarm", "not run"
TEXT = "text"  # paper A's canaries, and a text model's hex canaries
COLUMNS = {"model": pl.Utf8, "modality": pl.Utf8, "claim": pl.Utf8, "paper_id": pl.Utf8, "construction": pl.Utf8,
           "expected": pl.Utf8,
           "positive": pl.Utf8, "positive_reading": pl.Utf8, "spill_over": pl.Float64, "positive_verdict": pl.Utf8,
           "negative": pl.Utf8, "negative_reading": pl.Utf8, "negative_verdict": pl.Utf8, "why": pl.Utf8}


def _reader(claim: Claim, contrast: str, modality: str) -> Callable[[Run, str, Side], Reading]:
    """How `claim` reads one side: the papers' reading for its measure (paper
    B's on the canaries of `modality`; paper A's canaries are text)."""
    readers: dict[str, Callable[[Run, str, Side], Reading]] = {
        "bypass_gap": lambda run, v, side: read_gap(run, v),
        "head_echo": lambda run, v, side: read_head_echo(run, v),
        "delta_ab": lambda run, v, side: read_delta(run, v, side.arm),
        "parser_flip": lambda run, v, side: read_parser_flip(run, v),
        "teacher_forced": lambda run, v, side: read_tf_vs_greedy(run, v, f"prefill_{contrast}", _reference(run, v)),
        "window_truncation": lambda run, v, side: read_case(run, v, "window truncation", modality),
        "span_drift": lambda run, v, side: read_case(run, v, "non-secret span drift", modality),
        "undertrained": lambda run, v, side: read_case(run, v, "undertrained ambiguity", modality),
    }
    return readers[claim.key]


def _modalities(run: Run, model: str, claim: Claim) -> list[str]:
    """The canary modalities a claim's control is read on: paper A's are
    text; paper B's every modality the model's cells hold (image and text
    on a vision-language model)."""
    matrix = run.table("bsft_matrix")
    if claim.paper == "A" or matrix is None or not matrix.height:
        return [TEXT]
    return sorted(matrix.filter(pl.col("model") == model)["modality"].unique().to_list()) or [TEXT]


def _reference(run: Run, variant: str) -> str | None:
    """The never-trained reference a variant is compared with: its own, or
    for a planted control its BIO twin's (the same retain data)."""
    fields = run.variants.get(variant, {})
    own = run.references.get(variant, {}).get("reference")
    if own or fields.get("kind") != CONTROL:
        return own
    return run.references.get(f"{fields['model']}/mem-bio-s{fields['seed']}", {}).get("reference")


def spill_over(tokens: pl.DataFrame, pairs: dict[str, str], arm: str, think_open: dict[str, str]) -> dict[str, float]:
    """Per control variant, the mean |Delta NLL| per token of the prefilled
    trace against its twin (`pairs`: control -> twin) on the same canary
    items under prefill `arm`: the prompt-span tokens after the model's
    opening think tag (`think_open`: model -> tag) and before the closing
    one, which ends the prompt span (and is where the NOTAG plant's claim
    lives).  Each plant trains the same trace as its BIO twin, so a large
    value is an effect outside the claimed span.  The question before the
    tag is left out: no adapter trains it, so it drifts between any two
    adapters."""
    if not pairs or not tokens.height:
        return {}
    prompt = tokens.filter((pl.col("probe_set") == "canary") & (pl.col("arm") == arm) & (pl.col("span") == "prompt")
                           & pl.col("variant").is_in([*pairs, *pairs.values()]))
    tags = pl.DataFrame({"model": list(think_open), "tag": list(think_open.values())},
                        schema={"model": pl.Utf8, "tag": pl.Utf8})
    opened = (prompt.with_columns(model=pl.col("variant").str.split("/").list.first()).join(tags, on="model")
              .with_columns(opens=pl.col("position").filter(pl.col("token_text") == pl.col("tag")).max()
                            .over("variant", "item_id"), last=pl.col("position").max().over("variant", "item_id")))
    trace = opened.filter((pl.col("position") > pl.col("opens")) & (pl.col("position") < pl.col("last"))).select(
        "variant", "item_id", "position", "logprob")
    mapping = pl.DataFrame({"variant": list(pairs), "twin": list(pairs.values())})
    joined = trace.join(mapping, on="variant").join(
        trace.rename({"variant": "twin", "logprob": "twin_logprob"}), on=["twin", "item_id", "position"]
    )
    spill = joined.group_by("variant").agg((pl.col("logprob") - pl.col("twin_logprob")).abs().mean().alias("spill"))
    return dict(spill.rows())


def _label(variant: str, side: Side) -> str:
    """A side as the table names it: its variant, and its arm where it reads one."""
    return f"{variant}, {side.arm}" if side.arm else variant


def controls_table(run: Run, claims: dict[str, str], spill: dict[str, float]) -> pl.DataFrame:
    """One row per (model, canary modality, switched-on claim): the
    positive's and the negative's readings and verdicts, and the positive's
    spill-over; a claim the audit cannot run (`claims`: key -> why not, ""
    where it runs) reads `not run`, with why."""
    rows = []
    seeds = {(v["model"], v["seed"]) for v in run.variants.values() if v.get("kind") == CONTROL}
    for model, seed in sorted(seeds):
        for key in (k for k in CLAIMS if k in claims):  # declaration order, whatever order the config gives
            claim, why_not = CLAIMS[key], claims[key]
            if why_not:
                rows.append({"model": model, "modality": TEXT, "claim": key, "paper_id": claim.paper_id,
                             "construction": claim.construction, "expected": claim.expected,
                             "positive_verdict": NOT_RUN, "negative_verdict": NOT_RUN, "why": why_not})
                continue
            pos_name, neg_name = (f"{model}/{s.name(seed)}" for s in (claim.positive, claim.negative))
            if pos_name not in run.variants:  # a claim this model does not run (paper A's on a VL model)
                continue
            for modality in _modalities(run, model, claim):
                read = _reader(claim, run.contrast, modality)
                pos, neg = read(run, pos_name, claim.positive), read(run, neg_name, claim.negative)
                spilled = spill.get(pos_name)
                if pos.effect and spilled is not None and spilled > SPILL_BOUND:
                    pos_verdict = SPILLED
                else:
                    pos_verdict = SEEN if pos.effect else MISSED
                rows.append({
                    "model": model, "modality": modality, "claim": key, "paper_id": claim.paper_id,
                    "construction": claim.construction, "expected": claim.expected,
                    "positive": _label(pos_name, claim.positive), "positive_reading": pos.value,
                    "spill_over": spilled, "positive_verdict": pos_verdict,
                    "negative": _label(neg_name, claim.negative), "negative_reading": neg.value,
                    "negative_verdict": FALSE_ALARM if neg.effect else CLEAN,
                    "why": f"positive: {pos.why}; negative: {neg.why}",
                })
    return pl.DataFrame(rows, schema=COLUMNS)


FLOOR_COLUMNS = {"model": pl.Utf8, "modality": pl.Utf8, "claim": pl.Utf8, "variant": pl.Utf8,
                 "canaries_overwritten": pl.Int64,
                 "canaries": pl.Int64, "share": pl.Float64, "reading": pl.Utf8, "detected": pl.Boolean,
                 "floor_share": pl.Float64}


def detection_floor(run: Run, plants: dict[str, int], n_canaries: int) -> pl.DataFrame:
    """Per C3 plant diluted to n of the canaries (`plants`: variant -> n):
    the detector's reading of its cell and whether it reads `window
    truncation`; `floor_share` is the smallest share read per model (null
    where none is), the floor a paper's effect must clear to be seen here."""
    rows = []
    for variant, n in sorted(plants.items(), key=lambda kv: (kv[0].split("/")[0], kv[1])):
        reading = read_case(run, variant, "window truncation")
        rows.append({"model": variant.split("/")[0], "claim": FLOOR_CLAIM, "variant": variant,
                     "canaries_overwritten": n, "canaries": n_canaries, "share": n / n_canaries,
                     "reading": reading.value, "detected": bool(reading.effect)})
    frame = pl.DataFrame(rows, schema={k: v for k, v in FLOOR_COLUMNS.items() if k != "floor_share"})
    return frame.with_columns(floor_share=pl.col("share").filter(pl.col("detected")).min().over("model"))

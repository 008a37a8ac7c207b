"""The `controls` table: each planted control read by the papers' own
readings (canary_audit.verdicts.papers), positive and negative side by side, with
the positive plant's spill-over.

A positive reads `seen` when the reading finds the effect and `missed`
otherwise (also when the reading cannot be made: it says why); a negative
reads `clean` unless the reading finds the effect (`false alarm`), and
`not read` where the reading cannot be made (an absent cell is no evidence
of absence).  A
positive whose spill-over is above the bound reads `spilled`: it moved more
than its claim, so it calibrates nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import polars as pl

from canary_audit.core.records import HEX_SETS
from canary_audit.data.planted_controls import (
    CLAIMS,
    CLEAN,
    CONTROL,
    FALSE_ALARM,
    FLOOR_CLAIM,
    FLOOR_COMPOSED,
    HEX_PLANTS,
    MISSED,
    NOT_BUILT,
    NOT_READ,
    NOT_RUN,
    SEEN,
    SPILL_BOUND,
    SPILLED,
    Claim,
    Side,
    first_canaries,
    floor_counts,
)
from canary_audit.data.relearn import attack_name, is_relearning
from canary_audit.verdicts import drift
from canary_audit.verdicts.readings import (
    Reading,
    Run,
    cell_text,
    read_case,
    read_delta,
    read_gap,
    read_head_echo,
    read_merge_collapse,
    read_parser_flip,
    read_tf_vs_greedy,
    row_where,
)
from canary_audit.views import paper_b
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.paper_b import SPAN_DRIFT, UNDERTRAINED, WINDOW_TRUNCATION, Verdicts
from canary_audit.views.recovery import POSITIVE

HEX = HEX_SETS[0]

TEXT = "text"  # paper A's canaries, and a text model's hex canaries
COLUMNS = {"model": pl.Utf8, "seed": pl.Int64, "modality": pl.Utf8, "claim": pl.Utf8, "paper_id": pl.Utf8,
           "construction": pl.Utf8, "expected": pl.Utf8,
           "positive": pl.Utf8, "positive_reading": pl.Utf8, "spill_over": pl.Float64, "positive_verdict": pl.Utf8,
           "negative": pl.Utf8, "negative_reading": pl.Utf8, "negative_verdict": pl.Utf8,
           "positive_margin": pl.Float64, "negative_margin": pl.Float64, "drift_margin": pl.Float64,
           "clears_drift": pl.Boolean, "why": pl.Utf8}
# The value measure whose run-to-run drift (verdicts/drift.py) a control's
# margin must clear: paper A's in its rate; paper B's (a cell's margin is a
# share of the detector's threshold) in nats, divided by tables.verdicts.delta_nll.
DRIFT_OF = {"bypass_gap": ("bypass_gap",), "delta_ab": ("delta_ab",), "teacher_forced": ("tf_top1",),
            "parser_flip": ("bypass_gap",), "head_echo": (),
            **{k: ("window_delta", "span_delta") for k in ("window_truncation", "span_drift", "undertrained",
                                                           "merge_collapse")}}


def drift_margin(run: Run, key: str, stored: dict[str, float]) -> float | None:
    """The stated margin a control's readings must clear: its own drift
    where a pair measured it (drift.CONTROL_KEY), else its measure's
    (None: no pair measured either)."""
    if drift.CONTROL_KEY + key in stored:
        return stored[drift.CONTROL_KEY + key]
    found = [stored[m] for m in DRIFT_OF.get(key, ()) if m in stored]
    if not found:
        return None
    if key in CASES or key == "merge_collapse":
        return max(found) / run.thresholds.get("delta_nll", 1.0)
    return max(found)


def _reader(claim: Claim, contrast: str, modality: str) -> Callable[[Run, str, Side], Reading]:
    """How `claim` reads one side: the papers' reading for its measure (paper
    B's on the canaries of `modality`; paper A's canaries are text)."""
    readers: dict[str, Callable[[Run, str, Side], Reading]] = {
        "bypass_gap": lambda run, v, side: read_gap(run, v),
        "head_echo": lambda run, v, side: read_head_echo(run, v),
        "delta_ab": lambda run, v, side: read_delta(run, v, side.arm),
        "parser_flip": lambda run, v, side: read_parser_flip(run, v),
        "teacher_forced": lambda run, v, side: read_tf_vs_greedy(run, v, f"prefill_{contrast}", _reference(run, v)),
        **{key: partial(_read_case, case=case, modality=modality) for key, case in CASES.items()},
        "merge_collapse": partial(_read_collapse, modality=modality),
    }
    return readers[claim.key]


def _read_case(run: Run, variant: str, side: Side, case: str, modality: str) -> Reading:
    return read_case(run, variant, case, modality)


def _read_collapse(run: Run, variant: str, side: Side, modality: str) -> Reading:
    """A merged plant against the plant it applies, stacked (controls.HexPlant.applies)."""
    plant, seed = HEX_PLANTS[side.variant], run.variants.get(variant, {}).get("seed", 0)
    stacked = f"{variant.split('/')[0]}/{HEX_PLANTS[plant.applies].variant(seed)}"
    return read_merge_collapse(run, variant, stacked, plant.merge_dtype or "the model's", modality)


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
    rows, stored = [], drift.load()
    seeds = {(v["model"], v["seed"]) for v in run.variants.values() if v.get("kind") == CONTROL}
    for model, seed in sorted(seeds):
        for key in (k for k in CLAIMS if k in claims):  # declaration order, whatever order the config gives
            claim, why_not = CLAIMS[key], claims[key]
            if why_not:
                rows.append({"model": model, "seed": seed, "modality": TEXT, "claim": key, "paper_id": claim.paper_id,
                             "construction": claim.construction, "expected": claim.expected,
                             "positive_verdict": NOT_RUN, "negative_verdict": NOT_RUN, "why": why_not})
                continue
            names = {side: f"{model}/{side.name(seed)}" for side in claim.sides}
            if any(name not in run.variants for name in names.values()):
                continue  # a claim this model does not run (paper A's on a VL model, the merge collapse's)
            for modality in _modalities(run, model, claim):
                read = _reader(claim, run.contrast, modality)
                if claim.positive is None:
                    pos, pos_name, spilled, pos_verdict = Reading(claim.unbuilt, False, claim.unbuilt, ""), "", None, \
                        NOT_BUILT
                else:
                    pos_name = names[claim.positive]
                    pos, spilled = read(run, pos_name, claim.positive), spill.get(pos_name)
                    if pos.effect and spilled is not None and spilled > SPILL_BOUND:
                        pos_verdict = SPILLED
                    else:
                        pos_verdict = SEEN if pos.effect else MISSED
                stated = drift_margin(run, key, stored)
                for side in claim.negatives:
                    neg = read(run, names[side], side)
                    ends = [m for m in (pos.margin if claim.positive else None, neg.margin) if m is not None]
                    rows.append({
                        "model": model, "seed": seed, "modality": modality, "claim": key, "paper_id": claim.paper_id,
                        "construction": claim.construction, "expected": claim.expected,
                        "positive": _label(pos_name, claim.positive) if claim.positive else "",
                        "positive_reading": pos.value, "spill_over": spilled, "positive_verdict": pos_verdict,
                        "negative": _label(names[side], side), "negative_reading": neg.value,
                        "negative_verdict": NOT_READ if neg.effect is None else FALSE_ALARM if neg.effect else CLEAN,
                        "positive_margin": pos.margin if claim.positive else None, "negative_margin": neg.margin,
                        "drift_margin": stated,
                        "clears_drift": None if stated is None or not ends else min(ends) > stated,
                        "why": f"positive: {pos.why}; negative: {neg.why}",
                    })
    return pl.DataFrame(rows, schema=COLUMNS)


FLOOR_COLUMNS = {"model": pl.Utf8, "modality": pl.Utf8, "claim": pl.Utf8, "construction": pl.Utf8,
                 "variant": pl.Utf8, "canaries_overwritten": pl.Int64, "canaries": pl.Int64, "share": pl.Float64,
                 "effect": pl.Float64, "reading": pl.Utf8, "detected": pl.Boolean, "floor_share": pl.Float64,
                 "floor_effect": pl.Float64}
TRAINED, COMPOSED = "trained", "composed"
# The reading each paper B claim's floor is read by (the detector's diagnosis).
CASES = {"window_truncation": WINDOW_TRUNCATION, "span_drift": SPAN_DRIFT, "undertrained": UNDERTRAINED}


def compose_dilutions(tokens: pl.DataFrame, decode: pl.DataFrame, plans: dict[str, dict]
                      ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The records of each composed dilution (`plans`: composed name ->
    {plant, twin, canaries}): the plant's records of its first `canaries`
    hex canaries (controls.first_canaries, as a trained diluted plant picks
    them) and the twin's of every other item, under the composed name.  The
    records themselves are the plant's and the twin's, unchanged."""
    ids = {v: tokens.filter((pl.col("variant") == v) & (pl.col("probe_set") == HEX))["item_id"].unique().to_list()
           for v in {p["plant"] for p in plans.values()}}
    out = {"tokens": [], "decode": []}
    for name, plan in plans.items():
        carried = list(first_canaries(ids[plan["plant"]], plan["canaries"]))
        for key, frame in (("tokens", tokens), ("decode", decode)):
            on = pl.col("item_id").is_in(carried)
            out[key].append(pl.concat([
                frame.filter((pl.col("variant") == plan["plant"]) & on),
                frame.filter((pl.col("variant") == plan["twin"]) & ~on),
            ]).with_columns(variant=pl.lit(name)))
    return tuple(pl.concat(out[k]) if out[k] else frame.clear() for k, frame in (("tokens", tokens),
                                                                                ("decode", decode)))


def composed_cells(tokens: pl.DataFrame, decode: pl.DataFrame, parents: dict[str, str], cells: dict[str, dict],
                   composed: list[dict], n_canaries: int, window_k: int, verdicts: Verdicts,
                   boot: Bootstrap) -> tuple[pl.DataFrame, dict[str, dict]]:
    """The cells of every composed dilution (`composed`: the design's
    {model, claim, plant, twin} per claim with a floor) at floor_counts(n)
    canaries, read by the disagreement detector like any cell; and the
    plans behind them (composed name -> model, claim, plant, twin, canaries)."""
    plans = {f"{c['plant']}~x{n}": {**c, "canaries": n, "cell": f"composed {c['claim']} x{n}"}
             for c in composed for n in floor_counts(n_canaries)}
    if not plans:
        return pl.DataFrame(), plans
    keep = {*(p["plant"] for p in plans.values()), *(p["twin"] for p in plans.values())}
    keep |= {parents[v] for v in keep if v in parents}
    mine = [f.filter(pl.col("variant").is_in(list(keep))) for f in (tokens, decode)]
    new_tokens, new_decode = compose_dilutions(*mine, plans)
    frame = paper_b.cell_probes(
        pl.concat([mine[0], new_tokens], how="diagonal_relaxed"),
        pl.concat([mine[1], new_decode], how="diagonal_relaxed"),
        {**parents, **{name: parents[p["plant"]] for name, p in plans.items()}},
        {name: {**cells[p["plant"]], "cell": p["cell"]} for name, p in plans.items()},
        window_k, verdicts, boot)["cells"]
    return frame, plans


def _cell_row(matrix: pl.DataFrame | None, cell: dict | None, modality: str) -> dict | None:
    return row_where(matrix, model=cell["model"], cell=cell["cell"], modality=modality) if cell else None


def _effect(row: dict | None, claim: str) -> float | None:
    """A cell's effect in the claim's unit, signed the paper's way (controls.FLOOR_COMPOSED)."""
    column, sign = FLOOR_COMPOSED[claim][2:]
    return sign * row[column] if row is not None and row.get(column) is not None else None


def detection_floor(run: Run, plants: dict[str, int], n_canaries: int, composed: pl.DataFrame,
                    plans: dict[str, dict]) -> pl.DataFrame:
    """Per diluted plant (trained: C3's `plants`, variant -> n; composed:
    C3's, C4's and C5's at floor_counts(n), from `composed`, their cells):
    the detector's reading of its cell, the claim's effect in the paper's
    unit, and whether it reads the claim's case.  `floor_share` is the
    smallest share from which every larger share, of either construction,
    is read (null where the full plant is not), `floor_effect` the effect
    there: the floor a paper's effect must clear to be seen at this n."""
    rows = []
    for variant, n in plants.items():
        cell = run.cells.get(variant)
        row = _cell_row(run.table("bsft_matrix"), cell, TEXT)
        rows.append(_floor_row(variant, FLOOR_CLAIM, TRAINED, n, n_canaries, row))
    for plan in plans.values():
        found = composed.filter((pl.col("model") == plan["model"]) & (pl.col("cell") == plan["cell"])
                                & (pl.col("modality") == TEXT)) if composed.height else composed
        rows.append(_floor_row(plan["plant"], plan["claim"], COMPOSED, plan["canaries"], n_canaries,
                               found.row(0, named=True) if found.height else None))
    frame = pl.DataFrame(rows, schema={k: v for k, v in FLOOR_COLUMNS.items() if not k.startswith("floor_")})
    if frame.is_empty():
        return pl.DataFrame(schema=FLOOR_COLUMNS)
    # One floor per claim over both constructions' dilutions: each reading is evidence of what the
    # detector sees at its share, and a share one construction reads and the other does not is no floor.
    group = ["model", "modality", "claim"]
    # (at one share, an unread row after a read one, so the running minimum carries it down)
    frame = frame.sort(*group, "share", "detected", descending=[False] * (len(group) + 1) + [True]).with_columns(
        # every dilution from this one up is read: the reversed running minimum of `detected`
        from_here=pl.col("detected").reverse().cum_min().reverse().over(group))
    floor = (frame.filter(pl.col("from_here")).group_by(group)
             .agg(floor_share=pl.col("share").min(), floor_effect=pl.col("effect").sort_by("share").first()))
    return (frame.drop("from_here").join(floor, on=group, how="left").select(list(FLOOR_COLUMNS))
            .sort(*group, "construction", "share"))


def _floor_row(variant: str, claim: str, construction: str, n: int, n_canaries: int, row: dict | None) -> dict:
    diagnosis = row["diagnosis"] if row is not None else None
    return {"model": variant.split("/")[0], "modality": TEXT, "claim": claim, "construction": construction,
            "variant": variant if construction == TRAINED else f"{variant} ~ {n} of {n_canaries}",
            "canaries_overwritten": n, "canaries": n_canaries, "share": n / n_canaries, "effect": _effect(row, claim),
            "reading": f"{cell_text(row)}; {diagnosis}" if row is not None else "no cell in this run",
            "detected": diagnosis == CASES[claim]}


# Each recovery attack's planted control: (claim, construction), by the attack's name.
RECOVERY_CLAIMS = {
    "quantization": ("quantization_recovery",
                     "the unlearned checkpoint's change from its memorized parent clipped into the parent's rounding "
                     "bins (each block's scale elements held), so that the attack rounds it back to the quantized "
                     "parent: recovery by construction; negative: the never-trained reference attacked"),
    "relearning": ("relearning_recovery",
                   "a rank-1 LoRA trained by NPO on every author, stacked on the memorized adapter "
                   "(planted_controls.SUPPRESSION), relearned with the same budget: its forgetting is one direction "
                   "per module that relearning some authors reverses for all; negative: the never-trained reference "
                   "relearned"),
}


def attack_control(selector: dict) -> tuple[str, str] | None:
    """The planted control of a claim on attacked variants (its selector
    names `quantize` or `relearn`) and a pattern its positive's name
    matches (the same attack: format, or data and budget); None for any
    other claim."""
    if selector.get("quantize"):
        return RECOVERY_CLAIMS["quantization"][0], rf"\.{re.escape(str(selector['quantize']))}$"
    if selector.get("relearn"):
        steps = selector.get("relearn_steps")
        stem = attack_name(re.escape(str(selector["relearn"])), "[^.]+", 0).removesuffix("0")  # any template
        return RECOVERY_CLAIMS["relearning"][0], rf"\.{stem}{steps if steps else '[0-9]+'}$"
    return None


def recovery_attack(attack: str) -> str:
    """The kind of a recovery attack, from its name (views/recovery.py)."""
    return "relearning" if is_relearning(attack) else "quantization"


RECOVERY_CONTROL_MEASURE = "out_acc"  # the measure the attacks' positives are built and read on


def recovery_controls(recovery: pl.DataFrame | None, measure: str = RECOVERY_CONTROL_MEASURE) -> pl.DataFrame:
    """The recovery attacks' planted controls as rows of the controls
    table, read from the recovery table (views/recovery.py) on `measure`:
    per positive (a clipped plant quantized, a suppression plant relearned),
    its paired rise beside the attacked reference of the same model, seed
    and attack (the negative)."""
    if recovery is None or not recovery.height or "control" not in recovery.columns:
        return pl.DataFrame(schema=COLUMNS)
    rows = recovery.filter(pl.col("measure") == measure)

    def reading(r: dict) -> str:
        return (f"{measure} {r['before']:.2f} -> {r['after']:.2f}, paired Delta {r['delta']:+.3f} "
                f"[{r['delta_lo']:.3f}, {r['delta_hi']:.3f}] ({r['attack']})")

    out = []
    negatives = {(r["model"], r["seed"], r["attack"]): r for r in rows.filter(pl.col("role") == "reference")
                 .iter_rows(named=True)}
    for pos in rows.filter(pl.col("role") == POSITIVE).iter_rows(named=True):
        neg = negatives.get((pos["model"], pos["seed"], pos["attack"]))
        out.append({
            "model": pos["model"], "seed": pos["seed"], "modality": TEXT,
            "claim": RECOVERY_CLAIMS[recovery_attack(pos["attack"])][0], "paper_id": "recovery",
            "construction": RECOVERY_CLAIMS[recovery_attack(pos["attack"])][1],
            "expected": f"the attack raises {measure} (paired CI above 0); negative: it does not",
            "positive": pos["variant"], "positive_reading": reading(pos), "positive_verdict": pos["control"],
            "negative": neg["variant"] if neg else "", "negative_reading": reading(neg) if neg else "",
            "negative_verdict": neg["control"] if neg else NOT_READ,
            "positive_margin": pos["delta_lo"], "negative_margin": (-neg["delta_lo"]) if neg else None,
            "why": f"positive: the paired CI's lower end {pos['delta_lo']:+.3f} against 0; negative: "
                   + (f"its lower end {neg['delta_lo']:+.3f}" if neg else "no attacked reference in this run"),
        })
    return pl.DataFrame(out, schema=COLUMNS)

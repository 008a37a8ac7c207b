"""The built-in tables' builders: each a function of the records
(`Context`) that returns a table's title and frame, or None where these
records hold nothing for it.  publish/catalog.py declares the tables that
use them (name, part, plots, what the summary page shows)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import polars as pl

from canary_audit.core.records import CANDIDATE, HEX_SETS, MIA_POPULATIONS, NONMEMBER, PREAMBLE
from canary_audit.data.inclusion import COIN
from canary_audit.data.planted_controls import CONTROL, CONTROL_ARMS, SPILL_BOUND, is_control_group
from canary_audit.verdicts.bound_controls import bound_controls
from canary_audit.verdicts.controls import (
    composed_cells,
    controls_table,
    detection_floor,
    recovery_controls,
    spill_over,
)
from canary_audit.verdicts.readings import Run
from canary_audit.views import paper_a, paper_b
from canary_audit.views.audit_bound import bound_table, guesses_table
from canary_audit.views.blind import FOLDS, mark, withhold_privleak
from canary_audit.views.exposure import exposure_table
from canary_audit.views.extraction import extraction_table
from canary_audit.views.forgetting import forgetting_table
from canary_audit.views.mia import mia_table
from canary_audit.views.privacy import privacy_table
from canary_audit.views.recovery import MIA_MEASURE, recovery_table
from canary_audit.views.seeds import CELLS_TABLE, across_seeds, families, item_cells
from canary_audit.views.strata import strata_table
from canary_audit.views.table import Built, Context

log = logging.getLogger(__name__)
NONMEMBER_SETS = [pair[1] for pair in MIA_POPULATIONS.values()]


def run(ctx: Context) -> Run:
    """The papers' readings over the tables built so far."""
    return Run(None, ctx.cfg, {name: frame for name, (_, frame) in ctx.built.items()})


def if_author_canaries(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
    """A paper A table: built where the records hold author canaries."""
    return lambda ctx: build(ctx) if ctx.canary else None


def with_variants(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
    """A paper A table that reads each variant's run, template, seed and K."""

    def guarded(ctx: Context) -> Built | None:
        if not ctx.canary:
            return None
        if not ctx.variants:
            log.info("no variant table in the view config (`variants`): k_sweep, cross_seed and templates need "
                     "each variant's run, template, seed and K; the workflow's view_config.json has it")
            return None
        return build(ctx)

    return guarded


def with_mia(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
    """A table of the field's measures that needs the MIA settings (`mia`)."""

    def guarded(ctx: Context) -> Built | None:
        if not ctx.tokens.height:
            return None
        if ctx.mia is None:
            log.info("no membership-inference settings in the view config (`mia`: min_k, fpr): the mia, privacy, "
                     "forgetting and strata tables are left out; the workflow's view_config.json has them")
            return None
        return build(ctx)

    return guarded


def prefill_arms(ctx: Context) -> Built:
    """The prefill arms of the audit's variants and, below them, of the
    planted controls (their own arms, each with its Delta against AUTO)."""
    frame = paper_a.prefill_arms(ctx.decode, ctx.convention, ctx.boot, ctx.contrast)
    if ctx.controls:
        planted = paper_a.prefill_arms(ctx.all_decode.filter(pl.col("variant").is_in(ctx.controls)), ctx.convention,
                                       ctx.boot, ctx.contrast, deltas=list(CONTROL_ARMS))
        frame = pl.concat([frame, planted], how="diagonal_relaxed")
    return (f"Prefill arms at fixed weights: out_acc per arm and Delta_AB = AUTO - prefill_{ctx.contrast} "
            f"({ctx.ci})", frame)


def blind_baseline(ctx: Context) -> Built:
    b = ctx.boot
    return (f"Blind-baseline guard per membership population: each never-trained reference's AUC per attack "
            f"(two-sided) and a model-free character n-gram logistic regression over the items' text, {FOLDS}-fold "
            f"out-of-fold (one-sided), each tested against AUC 0.5 (Mann-Whitney), Bonferroni-adjusted over the "
            f"run's checks; a population with a failed check is `shifted` ({b.level:.0%} bootstrap CIs shown for "
            f"reading, B={b.replicates})", ctx.guard)


def mia(ctx: Context) -> Built:
    b = ctx.boot
    return (f"Membership inference over the secret span, members vs non-members of the same distribution (hex "
            f"canaries vs non-member records; author canaries vs non-member authors, per prefill arm): AUC and TPR "
            f"at low FPR of LOSS, zlib, Min-K% and Min-K%++ (k = {ctx.mia['min_k']}); {b.level:.0%} CIs: members "
            f"and non-members resampled, B={b.replicates}",
            mark(mia_table(ctx.mia_settings, ctx.mia["fpr"], b.level), ctx.guard))


def privacy(ctx: Context) -> Built:
    b = ctx.boot
    return (f"PrivLeak (MUSE: relative MIA AUC difference against the never-trained reference, %, per attack; "
            f"paired {b.level:.0%} bootstrap CIs, B={b.replicates}) and KS forget quality (p-value of the member "
            f"canaries' secret-span NLL against the reference's); no PrivLeak where the blind-baseline guard finds "
            f"the population `shifted`",
            withhold_privleak(mark(privacy_table(ctx.mia_settings, ctx.cfg.get("references", {}), b.level),
                                   ctx.guard)))


def exposure(ctx: Context) -> Built | None:
    if not ctx.has("token", CANDIDATE):
        return None
    b = ctx.boot
    return (f"Secret Sharer exposure of the hex canaries (bits) among R random candidates of their format: rank "
            f"interpolation (ceiling log2 R) and skew-normal extrapolation (capped at the secret space's bits: 64 "
            f"for the hex canaries), with Deltas against the parent ({b.level:.0%} CIs: canary-clustered bootstrap, "
            f"B={b.replicates})",
            exposure_table(ctx.tokens, ctx.parents, b.replicates, b.seed, b.level, ctx.cfg.get("secret_formats")))


def extraction(ctx: Context) -> Built | None:
    if not ctx.tokens.height:
        return None
    b = ctx.boot
    # Exposure's candidates and membership inference's non-members are reference
    # populations, not audited items (and would make this table's bootstrap 3-10x slower).
    items = ctx.tokens.filter(~pl.col("probe_set").is_in([CANDIDATE, *NONMEMBER_SETS]))
    return (f"Exact memorization and extraction strength over each item's secret span (open-unlearning's "
            f"definitions, from teacher-forced ranks), with Deltas against the parent ({b.level:.0%} CIs: bootstrap "
            f"clustered by author or hex canary, B={b.replicates})",
            extraction_table(items, ctx.parents, b.replicates, b.seed, b.level))


def forgetting(ctx: Context) -> Built:
    measures = {name: frame for name, (_, frame) in ctx.built.items()}
    measures["nll"] = pl.concat([measures.get("nll", pl.DataFrame()), ctx.author_nll], how="diagonal_relaxed")
    return ("How far each measure moved: per variant with a never-trained reference, the papers' behavioural probe "
            "(author canaries: out_acc, AUTO arm; hex canaries: hit@1) beside the teacher-forced secret NLL, exact "
            "memorization, extraction strength, exposure, MIA AUC (LOSS, Min-K%++), PrivLeak (Min-K%) and forget "
            "quality, each with its Delta against the parent", forgetting_table(measures, ctx.parents))


def strata(ctx: Context) -> Built | None:
    if not ctx.cfg.get("strata"):
        return None
    b = ctx.boot
    return (f"Secret Sharer's repetition strata: every hex probe per stratum (times the canary was inserted in the "
            f"canary LoRA's data): hit@1, hit@k, NLL over the first K={ctx.window_k} tokens and the secret span, "
            f"exposure, and the stratum's MIA AUC against all non-member records; Deltas against the parent "
            f"({b.level:.0%} CIs: canary-clustered bootstrap, B={b.replicates})",
            strata_table(ctx.decode, ctx.tokens, ctx.scores, {k: int(v) for k, v in ctx.cfg["strata"].items()},
                         ctx.parents, ctx.window_k, b.replicates, b.seed, b.level))


def bsft(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
    """A paper B table: built where the view config names bSFT cells."""
    return lambda ctx: build(ctx) if ctx.tokens.height and ctx.cfg.get("cells") else None


def bsft_ci(ctx: Context) -> str:
    return f"{ctx.boot.level:.0%} CIs: canary-clustered bootstrap, B={ctx.boot.replicates}"


def pooled_over_seeds(ctx: Context) -> Built | None:
    if not (ctx.canary and ctx.variants):
        return None
    pooled = across_seeds(ctx.decode, ctx.tokens, ctx.variants, ctx.convention, ctx.boot, ctx.contrast, ctx.window_k)
    if not pooled.height:  # only a run with two or more seeds of a family has one
        return None
    return (f"Paper A's rates pooled over training seeds, per family of variants trained under two or more (AUTO "
            f"arm; Delta_AB and teacher-forced top-1 under prefill_{ctx.contrast}); {ctx.boot.level:.0%} CIs: seed "
            f"x author bootstrap, B={ctx.boot.replicates}", pooled)


def seed_item_cells(ctx: Context) -> Built | None:
    if not (ctx.canary and ctx.variants):
        return None
    cells = item_cells(ctx.decode, ctx.tokens, ctx.variants, ctx.convention, ctx.contrast, ctx.window_k)
    if not cells.height:
        return None
    return (f"The seed x author layout behind the verdicts' seed-level intervals: each seeded variant's paper A "
            f"rates per author (AUTO arm; delta_ab and tf_top1_rate under prefill_{ctx.contrast}); "
            "verdicts/intervals.py reads it", cells)


def recovery(ctx: Context) -> Built | None:
    cells = ctx.built.get(CELLS_TABLE)
    if cells is None:
        return None
    utility = ctx.built.get("utility")
    scores = ctx.scores if ctx.mia is not None and ctx.tokens.height else None
    table = recovery_table(cells[1], utility[1] if utility else None, ctx.variants, ctx.cfg.get("references", {}),
                           ctx.boot, scores, f"prefill_{ctx.contrast}")
    if not table.height:
        return None
    return (f"Recovery attacks: each attacked variant (`after`) beside the variant it attacked (`before`), per "
            f"measure (the LOSS attack's AUC `{MIA_MEASURE}` under prefill_{ctx.contrast} beside the rates), with "
            f"their paired difference (`delta`); an unlearned row beside the same attack on its "
            f"memorized parent (`ceiling`) and its never-trained reference (`negative`); {ctx.ci}", table)


def _bound(ctx: Context, view: Callable[..., pl.DataFrame]) -> pl.DataFrame | None:
    """`view` (views/audit_bound.py: `bound_table`, `guesses_table`) over
    the scores of each coin-drawn population (the author canaries under the
    contrast prefill, `data.inclusion: coin`; the hex canaries behind their
    preambles, `data.hex_inclusion: coin`), skipping a relearning on a share
    of the members; None where no bound is given: on a fixed split the
    theorem's premise, a fair coin per candidate, does not hold."""
    settings = ctx.cfg.get("audit_bound")
    drawn = {**({"author": f"prefill_{ctx.contrast}"} if ctx.cfg.get("inclusion") == COIN else {}),
             **({"hex": PREAMBLE} if ctx.cfg.get("hex_inclusion") == COIN else {})}
    if settings is None or not drawn or ctx.mia is None or not ctx.tokens.height:
        return None
    relearned = {name for name, v in ctx.variants.items() if v.get("relearned")}
    table = view(ctx.scores, drawn, settings["shares"], settings["beta"], relearned, families(ctx.variants))
    return table if table.height else None


def audit_bound(ctx: Context) -> Built | None:
    """The one-run bound of each variant's coin-drawn canaries."""
    table = _bound(ctx, bound_table)
    if table is None:
        return None
    settings = ctx.cfg["audit_bound"]
    return (f"One-run audit bound (Steinke, Nasr and Jagielski 2023): a lower bound on epsilon (delta = 0) at "
            f"{1 - settings['beta']:.0%} confidence from guessing which canaries were coin-included, per "
            f"`population` (the LOSS, zlib, Min-K% and Min-K%++ scores of the author canaries under "
            f"prefill_{ctx.contrast}, of the hex canaries behind their preambles; `seeds` > 1: a family's seeds "
            f"pooled, each with its own coins; the k+ highest guessed "
            f"members and the k- lowest non-members over the grid of shares {settings['shares']}; Bonferroni over "
            f"the grid and the scores); `cap`: every candidate guessed right", table)


def audit_bound_guesses(ctx: Context) -> Built | None:
    """The bound at each number of guesses of the grid (the audit_bound
    plot's points), per variant and score."""
    table = _bound(ctx, guesses_table)
    if table is None:
        return None
    return (f"The one-run audit bound at each (k+, k-) of the grid of shares {ctx.cfg['audit_bound']['shares']}, "
            f"per variant and score, at the corrected level the audit_bound table spends (its row per score is the "
            f"best here); all_right: the bound had every one of those guesses been right", table)


def controls(ctx: Context) -> Built | None:
    """The planted controls' rows, the recovery attacks' and the one-run
    bound's: the bound's controls are the audited models themselves, so they
    are read even where no plant was trained (paper A's controls off)."""
    recovery = ctx.built.get("recovery")
    bound = ctx.built.get("audit_bound")
    tables = [recovery_controls(recovery[1] if recovery else None),
              bound_controls(bound[1] if bound else None, ctx.variants, ctx.cfg.get("references", {}))]
    if ctx.controls:  # paper B's plants are read without paper A's records (configs/floor80.yaml)
        twins = {name: f"{v['model']}/mem-bio-s{v['seed']}" for name, v in ctx.variants.items()
                 if v.get("kind") == CONTROL and is_control_group(v.get("group"))}  # paper A's plants
        spill = spill_over(ctx.all_tokens, twins, f"prefill_{ctx.contrast}", ctx.cfg.get("think_open", {}))
        tables.insert(0, controls_table(run(ctx), ctx.cfg.get("controls", {}), spill))
    table = pl.concat(tables)
    if not table.height:
        return None
    return (f"Planted controls: each claim's positive control (the effect by construction) and negative (built the "
            f"same way without it), read by the papers' own readings from the tables above ({ctx.ci}); spill_over: "
            f"mean |Delta NLL| per token of the prefilled trace against the BIO twin (a positive above {SPILL_BOUND} "
            f"reads `spilled`); the recovery attacks' controls read from the recovery table, the audit bound's from "
            f"the audit_bound table", table)


def floor(ctx: Context) -> Built | None:
    if not ((ctx.cfg.get("floor_plants") or ctx.cfg.get("composed_floors")) and "bsft_matrix" in ctx.built):
        return None
    n = ctx.cfg["n_hex_canaries"]
    cells, plans = composed_cells(ctx.all_tokens, ctx.all_decode, ctx.parents, ctx.cfg["cells"],
                                  ctx.cfg.get("composed_floors", []), n, ctx.window_k,
                                  paper_b.Verdicts(**ctx.cfg.get("verdicts", {})), ctx.boot)
    return ("Detection floor: paper B's plants diluted to n of the hex canaries, each read by the disagreement "
            "detector: `trained` (C3: a LoRA that overwrites n canaries and anchors the rest) and `composed` (C3, "
            "C4, C5: the full plant's records of n canaries beside its nothing-overwritten twin's of the rest, no "
            "training); effect is the claim's effect in the paper's unit (C3: hit@1 lost, C4: Delta mean-K, C5: "
            "Delta secret); floor_share is the smallest share from which every larger one is read at this run's n, "
            "floor_effect the effect there",
            detection_floor(run(ctx), ctx.cfg.get("floor_plants", {}), n, cells, plans))


def hex_tokens(ctx: Context) -> pl.DataFrame:
    return ctx.tokens.filter(pl.col("probe_set").is_in([*HEX_SETS, NONMEMBER]))

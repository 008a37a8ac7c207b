"""The table registry: every table of the audit declared once.

A `Table` (declared in views/table.py) is its name, the part of the audit it
belongs to (which decides, from the config alone, whether a run declares it:
`Design.table_names`), the plots drawn from it, and its builder: a function
of the records (`Context`) that returns its title and frame, or None where
these records hold nothing for it.  The tables job (`build_tables`), the workflow's outputs, the plots,
the summary page and docs/reference.md's table list all read this registry;
a probe kind adds its own tables beside its items (probes/kinds/).

The order of `BUILT_IN` is the build order: a table reading others (the
forgetting table, the controls, the detection floor) comes after them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import polars as pl

from canary_audit.controls import CONTROL, CONTROL_ARMS, CONTROL_GROUP, FLOOR_TABLE, SPILL_BOUND
from canary_audit.controls import TABLE as CONTROLS_TABLE
from canary_audit.readings import Run
from canary_audit.records import CANDIDATE, HEX_SETS, MIA_POPULATIONS, NONMEMBER
from canary_audit.views import paper_a, paper_b
from canary_audit.views.blind import FOLDS, mark, withhold_privleak
from canary_audit.views.controls import composed_cells, controls_table, detection_floor, spill_over
from canary_audit.views.exposure import exposure_table
from canary_audit.views.extraction import extraction_table
from canary_audit.views.forgetting import forgetting_table
from canary_audit.views.metrics import hex_recall, nll_table
from canary_audit.views.mia import mia_table
from canary_audit.views.privacy import privacy_table
from canary_audit.views.seeds import TABLE as SEED_TABLE
from canary_audit.views.seeds import across_seeds
from canary_audit.views.strata import strata_table
from canary_audit.views.table import Built, Context, Table

log = logging.getLogger(__name__)
NONMEMBER_SETS = [pair[1] for pair in MIA_POPULATIONS.values()]


def _run(ctx: Context) -> Run:
    """The papers' readings over the tables built so far."""
    return Run(None, ctx.cfg, {name: frame for name, (_, frame) in ctx.built.items()})


def _paper_a(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
    """A paper A table: built where the records hold author canaries."""
    return lambda ctx: build(ctx) if ctx.canary else None


def _with_variants(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
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


def _with_mia(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
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


def _prefill_arms(ctx: Context) -> Built:
    """The prefill arms of the audit's variants and, below them, of the
    planted controls (their own arms, each with its Delta against AUTO)."""
    frame = paper_a.prefill_arms(ctx.decode, ctx.convention, ctx.boot, ctx.contrast)
    if ctx.controls:
        planted = paper_a.prefill_arms(ctx.all_decode.filter(pl.col("variant").is_in(ctx.controls)), ctx.convention,
                                       ctx.boot, ctx.contrast, deltas=list(CONTROL_ARMS))
        frame = pl.concat([frame, planted], how="diagonal_relaxed")
    return (f"Prefill arms at fixed weights: out_acc per arm and Delta_AB = AUTO - prefill_{ctx.contrast} "
            f"({ctx.ci})", frame)


def _blind_baseline(ctx: Context) -> Built:
    b = ctx.boot
    return (f"Blind-baseline guard per membership population: each never-trained reference's AUC per attack "
            f"(two-sided) and a model-free character n-gram logistic regression over the items' text, {FOLDS}-fold "
            f"out-of-fold (one-sided), each tested against AUC 0.5 (Mann-Whitney), Bonferroni-adjusted over the "
            f"run's checks; a population with a failed check is `shifted` ({b.level:.0%} bootstrap CIs shown for "
            f"reading, B={b.replicates})", ctx.guard)


def _mia(ctx: Context) -> Built:
    b = ctx.boot
    return (f"Membership inference over the secret span, members vs non-members of the same distribution (hex "
            f"canaries vs non-member records; author canaries vs non-member authors, per prefill arm): AUC and TPR "
            f"at low FPR of LOSS, zlib, Min-K% and Min-K%++ (k = {ctx.mia['min_k']}); {b.level:.0%} CIs: members "
            f"and non-members resampled, B={b.replicates}",
            mark(mia_table(ctx.mia_settings, ctx.mia["fpr"], b.level), ctx.guard))


def _privacy(ctx: Context) -> Built:
    b = ctx.boot
    return (f"PrivLeak (MUSE: relative MIA AUC difference against the never-trained reference, %, per attack; "
            f"paired {b.level:.0%} bootstrap CIs, B={b.replicates}) and KS forget quality (p-value of the member "
            f"canaries' secret-span NLL against the reference's); no PrivLeak where the blind-baseline guard finds "
            f"the population `shifted`",
            withhold_privleak(mark(privacy_table(ctx.mia_settings, ctx.cfg.get("references", {}), b.level),
                                   ctx.guard)))


def _exposure(ctx: Context) -> Built | None:
    if not ctx.has("token", CANDIDATE):
        return None
    b = ctx.boot
    return (f"Secret Sharer exposure of the hex canaries (bits) among R random candidates of their format: rank "
            f"interpolation (ceiling log2 R) and skew-normal extrapolation (capped at the secret space's bits: 64 "
            f"for the hex canaries), with Deltas against the parent ({b.level:.0%} CIs: canary-clustered bootstrap, "
            f"B={b.replicates})",
            exposure_table(ctx.tokens, ctx.parents, b.replicates, b.seed, b.level, ctx.cfg.get("secret_formats")))


def _extraction(ctx: Context) -> Built | None:
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


def _forgetting(ctx: Context) -> Built:
    measures = {name: frame for name, (_, frame) in ctx.built.items()}
    measures["nll"] = pl.concat([measures.get("nll", pl.DataFrame()), ctx.author_nll], how="diagonal_relaxed")
    return ("How far each measure moved: per variant with a never-trained reference, the papers' behavioural probe "
            "(author canaries: out_acc, AUTO arm; hex canaries: hit@1) beside the teacher-forced secret NLL, exact "
            "memorization, extraction strength, exposure, MIA AUC (LOSS, Min-K%++), PrivLeak (Min-K%) and forget "
            "quality, each with its Delta against the parent", forgetting_table(measures, ctx.parents))


def _strata(ctx: Context) -> Built | None:
    if not ctx.cfg.get("strata"):
        return None
    b = ctx.boot
    return (f"Secret Sharer's repetition strata: every hex probe per stratum (times the canary was inserted in the "
            f"canary LoRA's data): hit@1, hit@k, NLL over the first K={ctx.window_k} tokens and the secret span, "
            f"exposure, and the stratum's MIA AUC against all non-member records; Deltas against the parent "
            f"({b.level:.0%} CIs: canary-clustered bootstrap, B={b.replicates})",
            strata_table(ctx.decode, ctx.tokens, ctx.scores, {k: int(v) for k, v in ctx.cfg["strata"].items()},
                         ctx.parents, ctx.window_k, b.replicates, b.seed, b.level))


def _bsft(build: Callable[[Context], Built]) -> Callable[[Context], Built | None]:
    """A paper B table: built where the view config names bSFT cells."""
    return lambda ctx: build(ctx) if ctx.tokens.height and ctx.cfg.get("cells") else None


def _bsft_ci(ctx: Context) -> str:
    return f"{ctx.boot.level:.0%} CIs: canary-clustered bootstrap, B={ctx.boot.replicates}"


def _across_seeds(ctx: Context) -> Built | None:
    if not (ctx.canary and ctx.variants):
        return None
    pooled = across_seeds(ctx.decode, ctx.tokens, ctx.variants, ctx.convention, ctx.boot, ctx.contrast, ctx.window_k)
    if not pooled.height:  # only a run with two or more seeds of a family has one
        return None
    return (f"Paper A's rates pooled over training seeds, per family of variants trained under two or more (AUTO "
            f"arm; Delta_AB and teacher-forced top-1 under prefill_{ctx.contrast}); {ctx.boot.level:.0%} CIs: seed "
            f"x author bootstrap, B={ctx.boot.replicates}", pooled)


def _controls(ctx: Context) -> Built | None:
    if not ctx.controls:  # paper B's plants are read without paper A's records (configs/floor80.yaml)
        return None
    twins = {name: f"{v['model']}/mem-bio-s{v['seed']}" for name, v in ctx.variants.items()
             if v.get("kind") == CONTROL and v.get("group") == CONTROL_GROUP}  # paper A's plants
    spill = spill_over(ctx.all_tokens, twins, f"prefill_{ctx.contrast}", ctx.cfg.get("think_open", {}))
    return (f"Planted controls: each claim's positive control (the effect by construction) and negative (built the "
            f"same way without it), read by the papers' own readings from the tables above ({ctx.ci}); spill_over: "
            f"mean |Delta NLL| per token of the prefilled trace against the BIO twin (a positive above {SPILL_BOUND} "
            f"reads `spilled`)", controls_table(_run(ctx), ctx.cfg.get("controls", {}), spill))


def _floor(ctx: Context) -> Built | None:
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
            detection_floor(_run(ctx), ctx.cfg.get("floor_plants", {}), n, cells, plans))


def _hex_tokens(ctx: Context) -> pl.DataFrame:
    return ctx.tokens.filter(pl.col("probe_set").is_in([*HEX_SETS, NONMEMBER]))


BUILT_IN: tuple[Table, ...] = (
    Table("canary_leakage", "paper_a", _paper_a(lambda c: (
        f"Canary leakage per variant and arm (parser: {c.convention.name}; {c.ci})", c.leakage))),
    Table("k_sweep", "paper_a", _with_variants(lambda c: (
        f"K sweep, AUTO arm, memorized adapter as K = 0; each run's method and effective settings ({c.ci})",
        c.sweep)), plots=("k_sweep",)),
    Table("cross_seed", "paper_a", _with_variants(lambda c: (
        "Cross-seed replication of the K sweep (AUTO arm)", paper_a.cross_seed(c.sweep)))),
    Table("templates", "paper_a", _with_variants(lambda c: (
        "Training-time template comparison (AUTO arm) with parser health",
        paper_a.template_comparison(c.audited(c.leakage), c.variants)))),
    Table("prefill_arms", "paper_a", _paper_a(_prefill_arms), plots=("prefill_arms",)),
    Table("parser_conventions", "paper_a", _paper_a(lambda c: (
        f"Parser conventions applied to the same AUTO generations ({c.ci})",
        paper_a.parser_conventions(c.all_decode, c.boot))), plots=("parser_conventions",)),
    Table("bypass_anatomy", "paper_a", _paper_a(lambda c: (
        f"Bypass-case anatomy, AUTO arm (parser: {c.convention.name})",
        paper_a.bypass_anatomy(c.all_decode, c.convention)))),
    Table("utility", "paper_a", lambda c: (
        f"QA and retain accuracy, retain substitutions of fictional authors ({c.ci})",
        paper_a.utility(c.decode, c.convention, c.boot)) if c.has("decode", "qa", "retain") else None),
    Table("hex_recall", "hex", lambda c: (
        "Hex canary behavioural recall (own secrets: each model's own record format)",
        hex_recall(c.decode, c.cfg.get("secret_formats"))) if c.has("decode", "hex") else None),
    Table("nll", "hex", lambda c: (
        f"Hex canaries, decoys and non-member records: NLL over the first K={c.window_k} tokens and over the secret "
        f"span, with Deltas against each variant's parent", nll_table(_hex_tokens(c), c.window_k, c.parents))
        if c.tokens.height else None),
    Table("teacher_forced", "paper_a", lambda c: (
        "Author canaries, teacher-forced after the head under each prefill: top-1 agreement and NLL over the "
        "canary continuation", c.author_nll.select("variant", "parent", "arm", "n", "top1_rate", "all_top1_rate",
                                                    "nll_secret", "delta_nll_secret"))
        if c.tokens.height else None),
    Table("blind_baseline", "always", _with_mia(_blind_baseline)),
    Table("mia", "always", _with_mia(_mia)),
    Table("privacy", "always", _with_mia(_privacy)),
    Table("exposure", "exposure", _exposure),
    Table("extraction", "always", _extraction),
    Table("forgetting", "always", _with_mia(_forgetting)),
    Table("strata", "strata", _with_mia(_strata), plots=("dose_response",)),
    Table("bsft_runs", "bsft", _bsft(lambda c: (
        f"bSFT cells, seed-level runs: every probe against the merged base ({_bsft_ci(c)}; {c.bsft_rule})",
        c.cell_probes["runs"]))),
    Table("bsft_matrix", "bsft", _bsft(lambda c: (
        f"bSFT cell x probe matrix, seeds pooled: verdicts, diagnosis, evidence ({c.bsft_rule}; window "
        f"K={c.window_k})", paper_b.matrix(c.cell_probes["cells"]))), plots=("disagreement_matrix",)),
    Table("bsft_decomposition", "bsft", _bsft(lambda c: (
        f"Span decomposition of the windowed (K={c.window_k}) and secret-span Deltas",
        paper_b.decomposition(c.cell_probes["cells"])))),
    Table("bsft_merged_vs_stacked", "merged_vs_stacked", _bsft(lambda c: (
        "The same bSFT adapters stacked on vs merged into the merged base, merged in each model's merge precision "
        "(models.<m>.merge_dtype)", paper_b.merged_vs_stacked(c.grid, c.cfg.get("merge_precision", {}))))),
    Table("bsft_case_studies", "bsft", _bsft(lambda c: (
        "Paper B's three case studies, as found in this grid", paper_b.case_studies(c.grid, c.window_k)))),
    Table("teacher_forced_vs_greedy", "paper_a", lambda c: (
        f"Teacher-forced vs greedy on the same canaries and weights, per prefill arm ({c.ci})",
        paper_a.teacher_forced_vs_greedy(c.all_decode, c.all_tokens, c.convention, c.boot, c.window_k))
        if c.canary and c.tokens.height else None, plots=("teacher_forced_vs_greedy",)),
    Table(SEED_TABLE, "seeds", _across_seeds),
    Table(CONTROLS_TABLE, "controls", _controls),
    Table(FLOOR_TABLE, "floor", _floor),
)


def registry() -> tuple[Table, ...]:
    """Every table: the built-in ones, then each probe kind's own (in the
    probe registry's order), then `provenance` (written by the tables job
    from the records files, tables.records_provenance).  Names are unique."""
    from canary_audit.probes.kinds import probe_kinds

    tables = (*BUILT_IN, *(t for kind in probe_kinds() for t in kind.tables), PROVENANCE)
    names = [t.name for t in tables]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"tables declared twice in the table registry: {', '.join(twice)}")
    return tables


# Built from the records files, not the records (tables.write_tables fills it).
PROVENANCE = Table("provenance", "always", lambda ctx: None)


def table_named(name: str) -> Table:
    return {t.name: t for t in registry()}[name]


def build_tables(decode: pl.DataFrame, tokens: pl.DataFrame, cfg: dict) -> dict[str, Built]:
    """Every table the records fill, in the registry's order."""
    ctx = Context(decode, tokens, cfg)
    for table in registry():
        built = table.build(ctx)
        if built is not None:
            ctx.built[table.name] = built
    return ctx.built

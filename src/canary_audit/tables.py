"""Tables: views over records, written as CSV (for code) and Markdown (for people).

Reads only records files; never a model, never the synthetic data.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl

from canary_audit.controls import CONTROL, CONTROL_ARMS, CONTROL_GROUP, FLOOR_TABLE, SPILL_BOUND
from canary_audit.controls import TABLE as CONTROLS_TABLE
from canary_audit.readings import Run
from canary_audit.records import (
    CANDIDATE,
    HEX_SETS,
    MIA_POPULATIONS,
    NONMEMBER,
    RecordsError,
    hashes_by_unit,
    read_records,
)
from canary_audit.views import paper_a, paper_b
from canary_audit.views.blind import FOLDS, guard_table, mark, withhold_privleak
from canary_audit.views.controls import controls_table, detection_floor, spill_over
from canary_audit.views.exposure import exposure_table
from canary_audit.views.extraction import extraction_table
from canary_audit.views.forgetting import forgetting_table
from canary_audit.views.metrics import hex_recall, nll_table
from canary_audit.views.mia import item_scores, mia_table, settings
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.parser import ParserConvention
from canary_audit.views.privacy import privacy_table
from canary_audit.views.seeds import TABLE as SEED_TABLE
from canary_audit.views.seeds import across_seeds
from canary_audit.views.strata import strata_table

log = logging.getLogger(__name__)
NONMEMBER_SETS = [pair[1] for pair in MIA_POPULATIONS.values()]


def format_cell(value: object, digits: int = 3) -> str:
    """One Markdown cell.  A float is rounded to `digits` decimals, except a
    non-zero one that rounding would show as 0 (a KS forget quality of 1e-15,
    a p-value), which keeps three significant digits in scientific notation:
    a reader must not see a zero that is not one."""
    if value is None:
        return ""
    if isinstance(value, float) and value != 0 and abs(value) < 0.5 * 10 ** -digits:
        return f"{value:.2e}"
    if isinstance(value, float):
        return str(round(value, digits))
    return str(value)


def to_markdown(frame: pl.DataFrame, digits: int = 3) -> str:
    """A GitHub Markdown table; floats as `format_cell` shows them."""
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(format_cell(v, digits) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows]) + "\n"


def concat_records(paths: list[Path], kind: str, expected: dict[str, str] | None = None) -> pl.DataFrame:
    """All records of one kind.  Each probe unit's records must carry one
    config hash across all files (else a table would compare unlike things)
    and, given `expected` (probe unit -> the hash of the settings the
    workflow is tabulating), that one."""
    if not paths:
        return pl.DataFrame()
    frames = {p: read_records(p, kind) for p in paths}
    found = pl.concat([hashes_by_unit(f).with_columns(path=pl.lit(str(p))) for p, f in frames.items()])
    rerun = f"`snakemake -R {'decode_pass' if kind == 'decode' else 'teacher_forced_pass'}`"
    if expected is not None:
        current = pl.col("unit").replace_strict(expected, default=None)  # null: a unit the config does not have
        stale = found.filter((pl.col("config_hash") != current).fill_null(True))
        if stale.height:
            listing = ", ".join(f"{p} ({u}: {h})" for u, h, p in stale.rows())
            raise RecordsError(
                f"{kind} records were written under other probe settings than the current ones "
                f"({expected}): {listing}; re-run their probe passes ({rerun}) before tabulating"
            )
    mixed = found.filter(pl.col("config_hash").n_unique().over("unit") > 1)
    if mixed.height:
        listing = ", ".join(f"{p} ({u}: {h})" for u, h, p in mixed.rows())
        raise RecordsError(
            f"{kind} records come from different probe settings: {listing}; re-run the stale probe "
            f"passes ({rerun}; snakemake does this when the config changed) before tabulating"
        )
    return pl.concat(frames.values())


def write_table(frame: pl.DataFrame, out_dir: Path, name: str, title: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.csv.tmp"
    frame.write_csv(tmp)
    tmp.replace(out_dir / f"{name}.csv")
    (out_dir / f"{name}.md").write_text(f"## {title}\n\n" + to_markdown(frame))


def build_tables(decode: pl.DataFrame, tokens: pl.DataFrame, cfg: dict) -> dict[str, tuple[str, pl.DataFrame]]:
    """Every table of the audit from the two record kinds and the view config."""
    convention = ParserConvention(**cfg.get("parser", {}))
    boot = Bootstrap(**cfg.get("bootstrap", {}))
    window_k, parents, variants = cfg["window_k"], cfg.get("parents", {}), cfg.get("variants", {})
    ci = f"{boot.level:.0%} CIs: author-clustered bootstrap, B={boot.replicates}"
    tables: dict[str, tuple[str, pl.DataFrame]] = {}
    # Planted controls are rows of the per-variant paper A tables (read there
    # like any variant) and of no other view: no measure pools them.
    controls = [name for name, v in variants.items() if v.get("kind") == CONTROL]
    everything, decode, tokens = (decode, tokens), *(_without(f, controls) for f in (decode, tokens))
    canary = decode.filter(pl.col("probe_set") == "canary") if decode.height else decode
    if canary.height:
        leakage = paper_a.canary_leakage(everything[0], convention, boot)
        tables["canary_leakage"] = (
            f"Canary leakage per variant and arm (parser: {convention.name}; {ci})", leakage
        )
        if variants:
            sweep = paper_a.k_sweep(_without(leakage, controls), variants)
            tables["k_sweep"] = (
                f"K sweep, AUTO arm, memorized adapter as K = 0; each run's method and effective settings ({ci})",
                sweep,
            )
            tables["cross_seed"] = ("Cross-seed replication of the K sweep (AUTO arm)", paper_a.cross_seed(sweep))
            tables["templates"] = (
                "Training-time template comparison (AUTO arm) with parser health",
                paper_a.template_comparison(_without(leakage, controls), variants),
            )
        else:
            log.info("no variant table in the view config (`variants`): k_sweep, cross_seed and templates need "
                     "each variant's run, template, seed and K; the workflow's view_config.json has it")
        tables["prefill_arms"] = (
            f"Prefill arms at fixed weights: out_acc per arm and Delta_AB = AUTO - "
            f"prefill_{cfg.get('prefill_contrast', 'bio')} ({ci})",
            _prefill_arms(everything[0], controls, convention, boot, cfg.get("prefill_contrast", "bio")),
        )
        tables["parser_conventions"] = (
            f"Parser conventions applied to the same AUTO generations ({ci})",
            paper_a.parser_conventions(everything[0], boot),
        )
        tables["bypass_anatomy"] = (
            f"Bypass-case anatomy, AUTO arm (parser: {convention.name})",
            paper_a.bypass_anatomy(everything[0], convention),
        )
    if decode.height and decode.filter(pl.col("probe_set").is_in(["qa", "retain"])).height:
        tables["utility"] = (
            f"QA and retain accuracy, retain substitutions of fictional authors ({ci})",
            paper_a.utility(decode, convention, boot),
        )
    if decode.height and decode.filter(pl.col("probe_set") == "hex").height:
        tables["hex_recall"] = ("Hex canary behavioural recall (own secrets: each model's own record format)",
                                hex_recall(decode, cfg.get("secret_formats")))
    if tokens.height:
        hex_tokens = tokens.filter(pl.col("probe_set").is_in([*HEX_SETS, NONMEMBER]))
        tables["nll"] = (
            f"Hex canaries, decoys and non-member records: NLL over the first K={window_k} tokens and over the "
            "secret span, with Deltas against each variant's parent",
            nll_table(hex_tokens, window_k, parents),
        )
        author_nll = nll_table(everything[1].filter(pl.col("probe_set") == "canary"), window_k, parents)
        tables["teacher_forced"] = (
            "Author canaries, teacher-forced after the head under each prefill: top-1 agreement and "
            "NLL over the canary continuation",
            author_nll.select(
                "variant", "parent", "arm", "n", "top1_rate", "all_top1_rate", "nll_secret", "delta_nll_secret"
            ),
        )
        mia = cfg.get("mia")
        if mia is None:
            log.info("no membership-inference settings in the view config (`mia`: min_k, fpr): the mia, privacy, "
                     "forgetting and strata tables are left out; the workflow's view_config.json has them")
        else:
            scores = item_scores(tokens, mia["min_k"])
            found = settings(scores, boot.replicates, boot.seed)
            guard = guard_table(tokens, found, cfg.get("references", {}), boot.replicates, boot.seed, boot.level)
            tables["blind_baseline"] = (
                f"Blind-baseline guard per membership population: each never-trained reference's AUC per attack "
                f"(two-sided) and a model-free character n-gram logistic regression over the items' text, "
                f"{FOLDS}-fold out-of-fold (one-sided), each tested against AUC 0.5 (Mann-Whitney), Bonferroni-"
                f"adjusted over the run's checks; a population with a failed check is `shifted` ({boot.level:.0%} "
                f"bootstrap CIs shown for reading, B={boot.replicates})",
                guard,
            )
            tables["mia"] = (
                f"Membership inference over the secret span, members vs non-members of the same distribution (hex "
                f"canaries vs non-member records; author canaries vs non-member authors, per prefill arm): AUC "
                f"and TPR at low FPR of LOSS, zlib, Min-K% and Min-K%++ (k = {mia['min_k']}); {boot.level:.0%} "
                f"CIs: members and non-members resampled, B={boot.replicates}",
                mark(mia_table(found, mia["fpr"], boot.level), guard),
            )
            tables["privacy"] = (
                f"PrivLeak (MUSE: relative MIA AUC difference against the never-trained reference, %, per attack; "
                f"paired {boot.level:.0%} bootstrap CIs, B={boot.replicates}) and KS forget quality (p-value of the "
                f"member canaries' secret-span NLL against the reference's); no PrivLeak where the blind-baseline "
                f"guard finds the population `shifted`",
                withhold_privleak(mark(privacy_table(found, cfg.get("references", {}), boot.level), guard)),
            )
        if tokens.filter(pl.col("probe_set") == CANDIDATE).height:
            tables["exposure"] = (
                f"Secret Sharer exposure of the hex canaries (bits) among R random candidates of their format: rank "
                f"interpolation (ceiling log2 R) and skew-normal extrapolation (capped at the secret space's bits: "
                f"64 for the hex canaries), with Deltas against the parent ({boot.level:.0%} CIs: canary-clustered "
                f"bootstrap, B={boot.replicates})",
                exposure_table(tokens, parents, boot.replicates, boot.seed, boot.level, cfg.get("secret_formats")),
            )
        tables["extraction"] = (
            f"Exact memorization and extraction strength over each item's secret span (open-unlearning's "
            f"definitions, from teacher-forced ranks), with Deltas against the parent ({boot.level:.0%} CIs: "
            f"bootstrap clustered by author or hex canary, B={boot.replicates})",
            # Exposure's candidates and membership inference's non-members are reference
            # populations, not audited items (and would make this table's bootstrap 3-10x slower).
            extraction_table(tokens.filter(~pl.col("probe_set").is_in([CANDIDATE, *NONMEMBER_SETS])), parents,
                             boot.replicates, boot.seed, boot.level),
        )
        if mia is not None:
            measures = {name: frame for name, (_, frame) in tables.items()}
            measures["nll"] = pl.concat([tables["nll"][1], author_nll], how="diagonal_relaxed")
            tables["forgetting"] = (
                "How far each measure moved: per variant with a never-trained reference, the papers' behavioural "
                "probe (author canaries: out_acc, AUTO arm; hex canaries: hit@1) beside the teacher-forced "
                "secret NLL, exact memorization, extraction strength, exposure, MIA AUC (LOSS, Min-K%++), "
                "PrivLeak (Min-K%) and forget quality, each with its Delta against the parent",
                forgetting_table(measures, parents),
            )
        if cfg.get("strata") and mia is not None:
            tables["strata"] = (
                f"Secret Sharer's repetition strata: every hex probe per stratum (times the canary was inserted in "
                f"the canary LoRA's data): hit@1, hit@k, NLL over the first K={window_k} tokens and the secret "
                f"span, exposure, and the stratum's MIA AUC against all non-member records; Deltas against the "
                f"parent ({boot.level:.0%} CIs: canary-clustered bootstrap, B={boot.replicates})",
                strata_table(decode, tokens, scores, {k: int(v) for k, v in cfg["strata"].items()}, parents,
                             window_k, boot.replicates, boot.seed, boot.level),
            )
        cells = cfg.get("cells", {})
        if cells:
            tables.update(bsft_tables(*everything, cfg, boot))  # a control cell is a row of the matrix
        if canary.height:
            tables["teacher_forced_vs_greedy"] = (
                f"Teacher-forced vs greedy on the same canaries and weights, per prefill arm ({ci})",
                paper_a.teacher_forced_vs_greedy(*everything, convention, boot, window_k),
            )
    pooled = across_seeds(decode, tokens, variants, convention, boot, cfg.get("prefill_contrast", "bio"), window_k) \
        if canary.height and variants else pl.DataFrame()
    if pooled.height:  # only a run with two or more seeds of a family has one
        tables[SEED_TABLE] = (
            f"Paper A's rates pooled over training seeds, per family of variants trained under two or more "
            f"(AUTO arm; Delta_AB and teacher-forced top-1 under prefill_{cfg.get('prefill_contrast', 'bio')}); "
            f"{boot.level:.0%} CIs: seed x author bootstrap, B={boot.replicates}",
            pooled,
        )
    if controls and canary.height:
        tables[CONTROLS_TABLE] = (
            f"Planted controls: each claim's positive control (the effect by construction) and negative (built the "
            f"same way without it), read by the papers' own readings from the tables above ({ci}); spill_over: mean "
            f"|Delta NLL| per token of the prefilled trace against the BIO twin (a positive above {SPILL_BOUND} "
            f"reads `spilled`)",
            _controls(tables, everything[1], cfg),
        )
    if cfg.get("floor_plants") and "bsft_matrix" in tables:
        run = Run(None, cfg, {name: frame for name, (_, frame) in tables.items()})
        tables[FLOOR_TABLE] = (
            "Detection floor: paper B's C3 plant diluted to n of the hex canaries (the rest anchored, nothing "
            "overwritten), each read by the disagreement detector; floor_share is the smallest share read as "
            "`window truncation` at this run's n",
            detection_floor(run, cfg["floor_plants"], cfg["n_hex_canaries"]),
        )
    return tables


def _without(frame: pl.DataFrame, variants: list[str]) -> pl.DataFrame:
    """`frame` without the rows of `variants` (the planted controls)."""
    return frame.filter(~pl.col("variant").is_in(variants)) if variants and frame.height else frame


def _prefill_arms(decode: pl.DataFrame, controls: list[str], convention: ParserConvention, boot: Bootstrap,
                  contrast: str) -> pl.DataFrame:
    """The prefill arms of the audit's variants and, below them, of the
    planted controls (their own arms, each with its Delta against AUTO)."""
    audit = paper_a.prefill_arms(_without(decode, controls), convention, boot, contrast)
    if not controls:
        return audit
    planted = paper_a.prefill_arms(decode.filter(pl.col("variant").is_in(controls)), convention, boot, contrast,
                                   deltas=list(CONTROL_ARMS))
    return pl.concat([audit, planted], how="diagonal_relaxed")


def _controls(tables: dict[str, tuple[str, pl.DataFrame]], tokens: pl.DataFrame, cfg: dict) -> pl.DataFrame:
    """The controls table, read from the tables built so far."""
    variants, claims = cfg.get("variants", {}), cfg.get("controls", {})
    run = Run(None, cfg, {name: frame for name, (_, frame) in tables.items()})
    twins = {name: f"{v['model']}/mem-bio-s{v['seed']}" for name, v in variants.items()
             if v.get("kind") == CONTROL and v.get("group") == CONTROL_GROUP}  # paper A's plants
    arm = f"prefill_{cfg.get('prefill_contrast', 'bio')}"
    return controls_table(run, claims, spill_over(tokens, twins, arm, cfg.get("think_open", {})))


def bsft_tables(decode: pl.DataFrame, tokens: pl.DataFrame, cfg: dict, boot: Bootstrap) -> dict:
    """Paper B's tables: every probe of every bSFT cell, the verdicts and the
    disagreement detector's diagnoses."""
    window_k, parents, cells = cfg["window_k"], cfg.get("parents", {}), cfg["cells"]
    verdicts = paper_b.Verdicts(**cfg.get("verdicts", {}))
    ci = f"{boot.level:.0%} CIs: canary-clustered bootstrap, B={boot.replicates}"
    rule = f"changed at |Delta NLL| >= {verdicts.delta_nll}, |Delta hit| >= {verdicts.hit_rate}"

    probes = paper_b.cell_probes(tokens, decode, parents, cells, window_k, verdicts, boot)
    pooled = probes["cells"]
    # A planted control's cell is a row of the matrix, never a case or a merge pair of the grid.
    grid = pooled.filter(pl.col("kind") != CONTROL) if pooled.height else pooled
    return {
        "bsft_runs": (f"bSFT cells, seed-level runs: every probe against the merged base ({ci}; {rule})",
                      probes["runs"]),
        "bsft_matrix": (f"bSFT cell x probe matrix, seeds pooled: verdicts, diagnosis, evidence ({rule}; "
                        f"window K={window_k})", paper_b.matrix(pooled)),
        "bsft_decomposition": (f"Span decomposition of the windowed (K={window_k}) and secret-span Deltas",
                               paper_b.decomposition(pooled)),
        "bsft_merged_vs_stacked": ("The same bSFT adapters stacked on vs merged into the merged base, merged in "
                                   "each model's merge precision (models.<m>.merge_dtype)",
                                   paper_b.merged_vs_stacked(grid, cfg.get("merge_precision", {}))),
        "bsft_case_studies": ("Paper B's three case studies, as found in this grid",
                              paper_b.case_studies(grid, window_k)),
    }


def records_provenance(decode: list[Path], tokens: list[Path]) -> pl.DataFrame:
    """Per records file: its kind, the code version(s) that wrote it (and
    their `sources`: the version without the commit) and how many records
    each wrote.  Tables built from more than one code version
    mix records from before and after a change; the warning names the files
    of each version."""
    rows = [
        {"file": str(path), "kind": kind, "code_version": version, "records": count}
        for kind, paths in (("decode", decode), ("token", tokens))
        for path in paths
        for version, count in pl.read_parquet(path, columns=["code_version"])["code_version"]
        .value_counts(sort=True).rows()
    ]
    frame = pl.DataFrame(rows, schema={"file": pl.Utf8, "kind": pl.Utf8, "code_version": pl.Utf8,
                                       "records": pl.Int64})
    # The source hash decides sameness; a commit that changed no source (docs) is no new code.
    frame = frame.with_columns(sources=pl.col("code_version").str.replace(r"\.git\..*$", ""))
    versions = frame["sources"].unique().sort().to_list()
    if len(versions) > 1:
        listing = "; ".join(
            f"{v}: {', '.join(frame.filter(pl.col('sources') == v)['file'].unique().sort())}" for v in versions
        )
        log.warning("the tables mix records written by %d code versions (%s); re-run the stale probe passes "
                    "(`snakemake -R decode_pass teacher_forced_pass`) to tabulate one version", len(versions), listing)
    return frame


def write_tables(decode: list[Path], tokens: list[Path], out_dir: Path, cfg: dict) -> dict[str, int]:
    expected = cfg.get("expected_hashes", {})
    tables = build_tables(
        concat_records(decode, "decode", expected.get("decode")),
        concat_records(tokens, "token", expected.get("token")),
        cfg,
    )
    provenance = records_provenance(decode, tokens)
    versions = provenance["sources"].n_unique()
    tables["provenance"] = (
        f"Records read, per file and code version ({versions} code version{'s' if versions != 1 else ''}"
        f"{': MIXED, see the tables log' if versions > 1 else ''})", provenance,
    )
    declared = cfg.get("tables")
    if declared is not None:  # the design's table registry (Design.table_names)
        extra = sorted(set(tables) - set(declared))
        held = [name for name in extra if tables[name][1].height]
        if held:
            raise ValueError(f"the records fill tables the design does not declare ({', '.join(held)}); "
                             "Design.table_names and tables.build_tables disagree")
        for name in extra:  # a view with nothing to show (e.g. no hex records): not this config's table
            del tables[name]
        for name in declared:
            if name not in tables:
                tables[name] = (f"{name}: no records of this run feed it (its probes were not run on any "
                                "audited variant)", pl.DataFrame())
    for name, (title, frame) in tables.items():
        write_table(frame, out_dir, name, title)
    # The view settings beside the tables (parents, paper B cells, thresholds):
    # whoever receives records and this file re-tabulates without the config
    # (`python -m canary_audit tables --params @view_config.json ...`).
    view = {k: v for k, v in cfg.items() if k != "expected_hashes"}
    (out_dir / "view_config.json").write_text(json.dumps(view, indent=1, sort_keys=True))
    return {name: frame.height for name, (_, frame) in tables.items()}

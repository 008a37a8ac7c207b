"""The table registry: every table of the audit declared once.

A `Table` (declared in views/table.py) is its name, the part of the audit it
belongs to (which decides, from the config alone, whether a run declares it:
`Design.table_names`), the plots drawn from it, its builder (a function of
the records, `Context`, that returns its title and frame, or None where
these records hold nothing for it: publish/builders.py) and what the run's
summary page shows of it (its `Page`s).  The tables job (`build_tables`),
the workflow's outputs, the plots, the summary page and docs/reference.md's
table list all read this registry; a probe kind adds its own tables beside
its items (probes/kinds/).

The order of `BUILT_IN` is the build order: a table reading others (the
forgetting table, the controls, the detection floor) comes after them.
"""

from __future__ import annotations

import polars as pl

from canary_audit.data.planted_controls import FLOOR_TABLE
from canary_audit.data.planted_controls import TABLE as CONTROLS_TABLE
from canary_audit.publish import builders as b
from canary_audit.views import paper_a, paper_b_tables
from canary_audit.views.metrics import hex_recall, nll_table
from canary_audit.views.seeds import CELLS_TABLE
from canary_audit.views.seeds import TABLE as SEED_TABLE
from canary_audit.views.table import Built, Context, Page, Table, with_ci

# What the summary page shows of a table (its entry's `pages`, ordered by
# `Page.place`; the papers' page and the config's claims lead the page:
# publish/summary.py).


def _controls_shown(f: pl.DataFrame) -> pl.DataFrame:
    return f.select("model", *(["modality"] if "modality" in f.columns else []), "claim", "positive",
                    "positive_reading", "spill_over", "positive_verdict", "negative", "negative_reading",
                    "negative_verdict")


def _floor_shown(f: pl.DataFrame) -> pl.DataFrame | None:
    if "construction" not in f.columns:
        return None
    keys = ["model", "claim", "construction", "canaries"]
    return f.sort([*keys, "share"]).group_by(keys, maintain_order=True).agg(
        read_at=pl.col("canaries_overwritten").filter(pl.col("detected")).cast(pl.Utf8).str.join(", "),
        floor_share=pl.col("floor_share").first(), floor_effect=pl.col("floor_effect").first())


def _arms_shown(f: pl.DataFrame) -> pl.DataFrame:
    rates = [c for c in f.columns if c not in ("variant", "n") and not c.endswith(("_lo", "_hi"))]
    return with_ci(f, rates).select("variant", *rates)


def _guard_sentence(f: pl.DataFrame) -> str:
    shifted = f.filter(pl.col("failed"))
    verdict = ("No population is shifted: every never-trained reference and the text-only baseline are consistent "
               "with AUC 0.5" if shifted.is_empty() else
               f"{shifted.select('model', 'population', 'modality', 'arm').unique().height} population(s) are "
               "SHIFTED: their MIA AUCs measure the populations' difference, and their PrivLeak is withheld")
    return f"{verdict} (Mann-Whitney against 0.5, Bonferroni over the run's {f['checks_in_run'][0]} checks)."


def _mia_shown(f: pl.DataFrame) -> pl.DataFrame:
    index = ["variant", "population", "modality", "arm", "members", "nonmembers", "shifted"]
    return with_ci(f, ["auc"]).pivot(on="attack", index=index, values="auc")


def _exposure_shown(f: pl.DataFrame) -> pl.DataFrame:
    keep = ("variant", "modality", "candidates", "exposure_interpolation", "exposure_extrapolation",
            "delta_exposure_extrapolation")
    return with_ci(f, ["exposure_interpolation", "exposure_extrapolation"]).select(c for c in keep if c in f.columns)


def _moved_shown(f: pl.DataFrame) -> pl.DataFrame | None:
    authors = f.filter(pl.col("population") == "author")
    return with_ci(authors, ["privleak_min_k"], 1).select(
        "variant", "arm", "paper_value", "delta_paper_value", "delta_nll_secret", "delta_exact_memorization",
        "auc_min_k_pp", "delta_auc_min_k_pp", "privleak_min_k", "forget_quality") if authors.height else None


def _canary_moved_shown(f: pl.DataFrame) -> pl.DataFrame | None:
    canary = f.filter((pl.col("population") == "hex") & pl.col("variant").str.contains("/canary-s"))
    keep = ("variant", "modality", "paper_value", "delta_nll_secret", "exposure_interpolation", "auc_min_k_pp",
            "privleak_min_k", "forget_quality")  # no exposure without candidates (`data.n_exposure_candidates: 0`)
    return with_ci(canary, ["privleak_min_k"], 1).select(c for c in keep if c in f.columns) if canary.height else None


def _strata_shown(f: pl.DataFrame) -> pl.DataFrame:
    keep = [c for c in ("variant", "modality", "repetitions", "n", "hit1", "exposure_interpolation", "auc_min_k_pp",
                        "delta_nll_secret") if c in f.columns]
    shown = [c for c in ("hit1", "exposure_interpolation", "auc_min_k_pp") if c in keep]
    return with_ci(f.filter(pl.col("variant").str.contains("/canary-s|/base$")), shown).select(keep)


def _matrix_shown(f: pl.DataFrame) -> pl.DataFrame:
    return with_ci(f, ["delta_window", "delta_secret", "delta_hit1"], 4).select(
        "model", "modality", "cell", "delta_window", "v_window", "delta_secret", "v_secret", "ref_hit1", "hit1",
        "v_hit1", "hitk", "v_hitk", "point_diagnosis", "diagnosis", "inconclusive_probes")



BUILT_IN: tuple[Table, ...] = (
    Table("canary_leakage", "paper_a", b.if_author_canaries(lambda c: (
        f"Canary leakage per variant and arm (parser: {c.convention.name}; {c.ci})", c.leakage))),
    Table("k_sweep", "paper_a", b.with_variants(lambda c: (
        f"K sweep, AUTO arm, memorized adapter as K = 0; each run's method and effective settings ({c.ci})",
        c.sweep)), plots=("k_sweep",),
        pages=(Page(
            3, "K sweep", "AUTO arm along each unlearning run; K = 0 is the memorized adapter (author-clustered "
            "bootstrap {ci} CIs).", lambda f: with_ci(f, ["out_acc", "thk_leak", "gap"]).select(
                "template", "run", "seed", "k", "out_acc", "thk_leak", "gap")),)),
    Table("cross_seed", "paper_a", b.with_variants(lambda c: (
        "Cross-seed replication of the K sweep (AUTO arm)", paper_a.cross_seed(c.sweep)))),
    Table("templates", "paper_a", b.with_variants(lambda c: (
        "Training-time template comparison (AUTO arm) with parser health",
        paper_a.template_comparison(c.audited(c.leakage), c.variants)))),
    Table("prefill_arms", "paper_a", b.if_author_canaries(b.prefill_arms), plots=("prefill_arms",),
        pages=(Page(
            4, "Prefill arms at fixed weights", "out_acc under each arm and Delta_AB = AUTO - the contrast prefill.",
            _arms_shown),)),
    Table("parser_conventions", "paper_a", b.if_author_canaries(lambda c: (
        f"Parser conventions applied to the same AUTO generations ({c.ci})",
        paper_a.parser_conventions(c.all_decode, c.boot))), plots=("parser_conventions",)),
    Table("bypass_anatomy", "paper_a", b.if_author_canaries(lambda c: (
        f"Bypass-case anatomy, AUTO arm (parser: {c.convention.name})",
        paper_a.bypass_anatomy(c.all_decode, c.convention)))),
    Table("utility", "paper_a", lambda c: (
        f"QA and retain accuracy, retain substitutions of fictional authors ({c.ci})",
        paper_a.utility(c.decode, c.convention, c.boot)) if c.has("decode", "qa", "retain") else None,
        pages=(Page(
            5, "Retain utility", "Retain accuracy and the share of answers naming a fictional author.",
            lambda f: with_ci(f.filter(pl.col("probe_set") == "retain"), ["accuracy", "substitution_rate"]).select(
                "variant", "accuracy", "substitution_rate")),)),
    Table("hex_recall", "hex", lambda c: (
        "Hex canary behavioural recall (own secrets: each model's own record format)",
        hex_recall(c.decode, c.cfg.get("secret_formats"))) if c.has("decode", "hex") else None,
        pages=(Page(
            6, "Hex canary recall", "Greedy hit@1 and hit@k over the hex canaries (text canaries, and on a "
            "vision-language model image canaries).", lambda f: f.select(
                c for c in ("variant", "modality", "n", "hit_at_1", "hit_at_k", "k") if c in f.columns)),)),
    Table("nll", "hex", lambda c: (
        f"Hex canaries, decoys and non-member records: NLL over the first K={c.window_k} tokens and over the secret "
        f"span, with Deltas against each variant's parent", nll_table(b.hex_tokens(c), c.window_k, c.parents))
        if c.tokens.height else None),
    Table("teacher_forced", "paper_a", lambda c: (
        "Author canaries, teacher-forced after the head under each prefill: top-1 agreement and NLL over the "
        "canary continuation", c.author_nll.select("variant", "parent", "arm", "n", "top1_rate", "all_top1_rate",
                                                    "nll_secret", "delta_nll_secret"))
        if c.tokens.height else None),
    Table("blind_baseline", "always", b.with_mia(b.blind_baseline),
        pages=(Page(
            7, "Membership populations: the blind-baseline guard", _guard_sentence,
            lambda f: with_ci(f, ["auc"]).select(
                "model", "population", "modality", "arm", "check", "reference", "attack", "auc", "p_adjusted",
                "failed")),)),
    Table("mia", "always", b.with_mia(b.mia),
        pages=(Page(
            8, "Membership inference (AUC)", "Members against non-members of the same distribution, per attack, over "
            "the secret span: hex canaries against non-member records of their format, and the fictional authors' "
            "canaries against non-member authors' under each prefill arm; 0.5 = chance (bootstrap {ci} CIs).",
            _mia_shown),)),
    Table("privacy", "always", b.with_mia(b.privacy)),
    Table("exposure", "exposure", b.exposure,
        pages=(Page(
            9, "Secret Sharer exposure (bits)", "Each hex canary's rank among random candidates of its format "
            "(interpolation, ceiling log2 R) and the skew-normal extrapolation (cap 64 bits), mean over canaries with "
            "canary-clustered {ci} CIs; Delta against the parent.", _exposure_shown),)),
    Table("extraction", "always", b.extraction),
    Table("forgetting", "always", b.with_mia(b.forgetting),
        pages=(Page(
            10, "What moved after unlearning", "Per memorization adapter and unlearning checkpoint and prefill arm: "
            "paper A's out_acc (AUTO arm) beside the teacher-forced secret NLL, exact memorization, Min-K%++ AUC "
            "(author canaries vs non-member authors), PrivLeak (Min-K%, against the never-trained reference of its "
            "retain form, {ci} CI) and KS forget quality; delta_ = against the parent (the memorized adapter; the base "
            "for it).", _moved_shown), Page(
            11, "The canary LoRA against its reference", "Hex canaries on the canary LoRA and its undertrained copy: "
            "hit@1 beside the same measures, and exposure (interpolation, bits).", _canary_moved_shown))),
    Table("strata", "strata", b.with_mia(b.strata), plots=("dose_response",),
        pages=(Page(
            12, "Repetition strata", "Secret Sharer's dose-response: each probe per number of times a canary was "
            "inserted in the canary LoRA's data (canary-clustered {ci} CIs).", _strata_shown),)),
    Table("bsft_runs", "bsft", b.bsft(lambda c: (
        f"bSFT cells, seed-level runs: every probe against the merged base ({b.bsft_ci(c)}; {c.bsft_rule})",
        c.cell_probes["runs"]))),
    Table("bsft_matrix", "bsft", b.bsft(lambda c: (
        f"bSFT cell x probe matrix, seeds pooled: verdicts, diagnosis, evidence ({c.bsft_rule}; window "
        f"K={c.window_k})", paper_b_tables.matrix(c.cell_probes["cells"]))), plots=("disagreement_matrix",),
        pages=(Page(
            13, "Paper B: cell x probe matrix", "Each probe's Delta against the merged base (canary-clustered {ci} "
            "CIs), its verdict, and the diagnosis; `inconclusive` when a probe's CI straddles its threshold (the "
            "point-estimate reading is in point_diagnosis).", _matrix_shown),)),
    Table("bsft_decomposition", "bsft", b.bsft(lambda c: (
        f"Span decomposition of the windowed (K={c.window_k}) and secret-span Deltas",
        paper_b_tables.decomposition(c.cell_probes["cells"])))),
    Table("bsft_merged_vs_stacked", "merged_vs_stacked", b.bsft(lambda c: (
        "The same bSFT adapters stacked on vs merged into the merged base, merged in each model's merge precision "
        "(models.<m>.merge_dtype)", paper_b_tables.merged_vs_stacked(c.grid, c.cfg.get("merge_precision", {}))))),
    Table("bsft_case_studies", "bsft", b.bsft(lambda c: (
        "Paper B's three case studies, as found in this grid", paper_b_tables.case_studies(c.grid, c.window_k)))),
    Table("teacher_forced_vs_greedy", "paper_a", lambda c: (
        f"Teacher-forced vs greedy on the same canaries and weights, per prefill arm ({c.ci})",
        paper_a.teacher_forced_vs_greedy(c.all_decode, c.all_tokens, c.convention, c.boot, c.window_k))
        if c.canary and c.tokens.height else None, plots=("teacher_forced_vs_greedy",)),
    Table(SEED_TABLE, "seeds", b.pooled_over_seeds),
    Table(CELLS_TABLE, "paper_a", b.seed_item_cells),
    Table("recovery", "recovery", b.recovery, plots=("relearning",),
        pages=(Page(
            3, "Recovery attacks", "Each unlearned checkpoint read again after an attack that should not restore "
            "what unlearning removed, beside its attacked parent (the ceiling) and reference (the negative); "
            "`testable` is false where the attacked parent leaves no more than the unlearning did.",
            lambda f: with_ci(f, ["before", "after", "delta"]).select(
                "variant", "role", "attack", "measure", "before", "after", "delta", "ceiling", "negative",
                "testable", "retain_before", "retain_after")),)),
    Table("audit_bound", "audit", b.audit_bound,
        pages=(Page(
            4, "One-run audit bound", "With 95% confidence the training leaked at least epsilon_lower (delta = 0) "
            "about which coin-included canaries (authors or hex) it saw: a lower bound, which can show leakage and "
            "never its absence (a bound of 0 is not a proof of privacy), capped by the candidates (`cap`); `seeds` "
            "> 1: a family's seeds pooled, each with its own coins.",
            lambda f: f.filter(pl.col("score") == "any").select(
                "variant", "population", "seeds", "picked", "candidates", "members", "guesses", "correct",
                "epsilon_lower", "cap")),)),
    Table("audit_bound_guesses", "audit", b.audit_bound_guesses, plots=("audit_bound",)),
    Table(CONTROLS_TABLE, "controls", b.controls,
        pages=(Page(
            1, "Planted controls", "Each claim's positive control holds the effect by construction, its negative is "
            "built the same way without it; both are read by the same reading as the papers' numbers above "
            "(canary_audit/data/planted_controls.py). `seen` / `clean` is what a calibrated instrument reads; "
            "spill_over is the positive's mean |Delta NLL| per trace token against its BIO twin.", _controls_shown),)),
    Table(FLOOR_TABLE, "floor", b.floor,
        pages=(Page(
            2, "Detection floor", "Paper B's plants diluted to n of the canaries (`trained`: a LoRA that overwrites n; "
            "`composed`: the full plant's records of n canaries beside its twin's of the rest), each read by the "
            "disagreement detector; the floor is the smallest share from which every larger one is read, its effect in "
            "the paper's unit (C3: hit@1 lost, C4: Delta mean-K, C5: Delta secret). `python -m canary_audit plan` says "
            "the n a paper's effect needs.", _floor_shown),)),
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

"""A run's headline results as one Markdown page, written from its tables
(never typed by hand): the K sweep, the prefill arms, retain utility, hex
recall, membership inference, exposure, what moved after unlearning, the
repetition strata (when the run has them) and paper B's cell x probe
matrix, with the code versions the tables read.  `python -m canary_audit summary --tables results/tables --out
docs/results.md` writes docs/results.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from canary_audit.claims.judge import beside_ours
from canary_audit.headline import NoHeadline, figures_markdown, headline_figures, write_readme
from canary_audit.tables import to_markdown


def with_ci(frame: pl.DataFrame, columns: list[str], digits: int = 2) -> pl.DataFrame:
    """Each `x` of `columns` as one text column `x [x_lo, x_hi]`."""
    def fmt(col: str) -> pl.Expr:
        value = pl.col(col).round(digits).cast(pl.Utf8)
        if f"{col}_lo" not in frame.columns:
            return value.alias(col)
        return pl.format("{} [{}, {}]", value, pl.col(f"{col}_lo").round(digits),
                         pl.col(f"{col}_hi").round(digits)).alias(col)
    return frame.with_columns(fmt(c) for c in columns)


def _read(tables: Path, name: str) -> pl.DataFrame | None:
    """A table, or None when the run has none or it is empty (an empty
    table's CSV has no header to read, or a header and no row)."""
    path = tables / f"{name}.csv"
    if not (path.is_file() and path.stat().st_size):
        return None
    try:
        frame = pl.read_csv(path)
    except pl.exceptions.NoDataError:  # a table with no columns is written as an empty line
        return None
    return frame if frame.height else None


def ci_level(tables: Path) -> str:
    """The CI level the tables were computed at (`tables.bootstrap.level`),
    as the tables job recorded it in `view_config.json`, e.g. "95%"."""
    path = tables / "view_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the summary states the CI level the tables were computed "
                                "at; point --tables at a tables folder the workflow's `tables` rule wrote")
    return f"{json.loads(path.read_text())['bootstrap']['level']:.0%}"


def sections(tables: Path) -> list[tuple[str, str, pl.DataFrame]]:
    """(title, sentence, frame) of each headline table the run has."""
    out = []
    ci = ci_level(tables)
    out.append(("The papers' numbers beside this run", "Each headline number of paper A and paper B (a claim of "
                "canary_audit/claims/paper_a.yaml or paper_b.yaml, with where it stands in its paper, judged like "
                "any claim) beside this run's value from the table "
                f"named in `source` ({ci} CIs). The verdict compares directions, not effect sizes: the embedded "
                "model is a toy, the papers' are 7B. `planted` says what the claim's planted control read in "
                "this run (the `controls` table, next).", beside_ours(tables)))
    if (controls := _read(tables, "controls")) is not None:
        out.append(("Planted controls", "Each claim's positive control holds the effect by construction, its "
                    "negative is built the same way without it; both are read by the same reading as the papers' "
                    "numbers above (canary_audit/controls.py). `seen` / `clean` is what a calibrated instrument "
                    "reads; spill_over is the positive's mean |Delta NLL| per trace token against its BIO twin.",
                    controls.select("model", *(["modality"] if "modality" in controls.columns else []), "claim",
                                    "positive", "positive_reading", "spill_over", "positive_verdict", "negative",
                                    "negative_reading", "negative_verdict")))
    if (floor := _read(tables, "detection_floor")) is not None and "construction" in floor.columns:
        keys = ["model", "claim", "construction", "canaries"]
        out.append(("Detection floor", "Paper B's plants diluted to n of the canaries (`trained`: a LoRA that "
                    "overwrites n; `composed`: the full plant's records of n canaries beside its twin's of the "
                    "rest), each read by the disagreement detector; the floor is the smallest share from which "
                    "every larger one is read, its effect in the paper's unit (C3: hit@1 lost, C4: Delta mean-K, "
                    "C5: Delta secret). `python -m canary_audit plan` says the n a paper's effect needs.",
                    floor.sort([*keys, "share"]).group_by(keys, maintain_order=True).agg(
                        read_at=pl.col("canaries_overwritten").filter(pl.col("detected")).cast(pl.Utf8)
                        .str.join(", "),
                        floor_share=pl.col("floor_share").first(), floor_effect=pl.col("floor_effect").first())))
    if (sweep := _read(tables, "k_sweep")) is not None:
        out.append(("K sweep", "AUTO arm along each unlearning run; K = 0 is the memorized adapter "
                    f"(author-clustered bootstrap {ci} CIs).",
                    with_ci(sweep, ["out_acc", "thk_leak", "gap"]).select("template", "run", "k", "out_acc",
                                                                          "thk_leak", "gap")))
    if (arms := _read(tables, "prefill_arms")) is not None:
        rates = [c for c in arms.columns if c not in ("variant", "n") and not c.endswith(("_lo", "_hi"))]
        out.append(("Prefill arms at fixed weights", "out_acc under each arm and Delta_AB = AUTO - the "
                    "contrast prefill.", with_ci(arms, rates).select("variant", *rates)))
    if (util := _read(tables, "utility")) is not None:
        retain = util.filter(pl.col("probe_set") == "retain")
        out.append(("Retain utility", "Retain accuracy and the share of answers naming a fictional author.",
                    with_ci(retain, ["accuracy", "substitution_rate"]).select("variant", "accuracy",
                                                                              "substitution_rate")))
    if (recall := _read(tables, "hex_recall")) is not None:
        keep = [c for c in ("variant", "modality", "n", "hit_at_1", "hit_at_k", "k") if c in recall.columns]
        out.append(("Hex canary recall", "Greedy hit@1 and hit@k over the hex canaries (text canaries, and on a "
                    "vision-language model image canaries).", recall.select(keep)))
    if (guard := _read(tables, "blind_baseline")) is not None and guard.height:
        shifted = guard.filter(pl.col("failed"))
        verdict = ("No population is shifted: every never-trained reference and the text-only baseline are "
                   "consistent with AUC 0.5" if shifted.is_empty() else
                   f"{shifted.select('model', 'population', 'modality', 'arm').unique().height} population(s) "
                   "are SHIFTED: their MIA AUCs measure the populations' difference, and their PrivLeak is "
                   "withheld")
        out.append(("Membership populations: the blind-baseline guard", f"{verdict} (Mann-Whitney against 0.5, "
                    f"Bonferroni over the run's {guard['checks_in_run'][0]} checks).",
                    with_ci(guard, ["auc"]).select("model", "population", "modality", "arm", "check", "reference",
                                                   "attack", "auc", "p_adjusted", "failed")))
    if (mia := _read(tables, "mia")) is not None and mia.height:
        index = ["variant", "population", "modality", "arm", "members", "nonmembers", "shifted"]
        wide = with_ci(mia, ["auc"]).pivot(on="attack", index=index, values="auc")
        out.append(("Membership inference (AUC)", "Members against non-members of the same distribution, per "
                    "attack, over the secret span: hex canaries against non-member records of their format, and "
                    "the fictional authors' canaries against non-member authors' under each prefill arm; 0.5 = "
                    f"chance (bootstrap {ci} CIs).", wide))
    if (exposure := _read(tables, "exposure")) is not None and exposure.height:
        out.append(("Secret Sharer exposure (bits)", "Each hex canary's rank among random candidates of its format "
                    "(interpolation, ceiling log2 R) and the skew-normal extrapolation (cap 64 bits), mean over "
                    f"canaries with canary-clustered {ci} CIs; Delta against the parent.",
                    with_ci(exposure, ["exposure_interpolation", "exposure_extrapolation"]).select(
                        c for c in ("variant", "modality", "candidates", "exposure_interpolation",
                                    "exposure_extrapolation", "delta_exposure_extrapolation")
                        if c in exposure.columns)))
    if (moved := _read(tables, "forgetting")) is not None:
        columns = ["variant", "arm", "paper_value", "delta_paper_value", "delta_nll_secret",
                   "delta_exact_memorization", "auc_min_k_pp", "delta_auc_min_k_pp", "privleak_min_k",
                   "forget_quality"]
        authors = moved.filter(pl.col("population") == "author")
        if authors.height:
            out.append(("What moved after unlearning", "Per memorization adapter and unlearning checkpoint and "
                        "prefill arm: paper A's out_acc (AUTO arm) beside the teacher-forced secret NLL, exact "
                        "memorization, Min-K%++ AUC (author canaries vs non-member authors), PrivLeak (Min-K%, "
                        f"against the never-trained reference of its retain form, {ci} CI) and KS forget quality; "
                        "delta_ = against the parent (the memorized adapter; the base for it).",
                        with_ci(authors, ["privleak_min_k"], 1).select(columns)))
        canary = moved.filter((pl.col("population") == "hex") & pl.col("variant").str.contains("/canary-s"))
        if canary.height:
            out.append(("The canary LoRA against its reference", "Hex canaries on the canary LoRA and its "
                        "undertrained copy: hit@1 beside the same measures, and exposure (interpolation, bits).",
                        with_ci(canary, ["privleak_min_k"], 1).select(
                            "variant", "modality", "paper_value", "delta_nll_secret", "exposure_interpolation",
                            "auc_min_k_pp", "privleak_min_k", "forget_quality")))
    if (strata := _read(tables, "strata")) is not None:
        keep = [c for c in ("variant", "modality", "repetitions", "n", "hit1", "exposure_interpolation",
                            "auc_min_k_pp", "delta_nll_secret") if c in strata.columns]
        out.append(("Repetition strata", "Secret Sharer's dose-response: each probe per number of times a canary "
                    f"was inserted in the canary LoRA's data (canary-clustered {ci} CIs).",
                    with_ci(strata.filter(pl.col("variant").str.contains("/canary-s|/base$")),
                            [c for c in ("hit1", "exposure_interpolation", "auc_min_k_pp") if c in keep]).select(keep)))
    if (matrix := _read(tables, "bsft_matrix")) is not None:
        out.append(("Paper B: cell x probe matrix", "Each probe's Delta against the merged base (canary-clustered "
                    f"{ci} CIs), its verdict, and the diagnosis; `inconclusive` when a probe's CI straddles its "
                    "threshold (the point-estimate reading is in point_diagnosis).",
                    with_ci(matrix, ["delta_window", "delta_secret", "delta_hit1"], 4).select(
                        "model", "modality", "cell", "delta_window", "v_window", "delta_secret", "v_secret",
                        "ref_hit1", "hit1", "v_hit1", "hitk", "v_hitk", "point_diagnosis", "diagnosis",
                        "inconclusive_probes")))
    return out


def write_summary(tables: Path, out: Path, readme: Path | None = None, claims: Path | None = None,
                  run: str = "") -> dict[str, int]:
    """Write the summary page; returns the rows of each section.  A run of
    the default audit's two models ends the page with the figures the
    README's short result quotes, and rewrites that section of `readme`
    and the pictures it shows (from the run's plots folder).  `claims`: the
    run's claims table (the config's `claims` judged), its own section after
    the papers'.  `run` says what the run was (its config, commit and
    machine), in the page's header."""
    provenance = _read(tables, "provenance")
    versions = sorted(provenance["code_version"].unique()) if provenance is not None else []
    parts = [
        "# Results of a run\n",
        f"Written by `python -m canary_audit summary --tables {tables} --out {out}` from that run's tables; "
        "do not edit by hand. Code version(s) of the records: " + (", ".join(f"`{v}`" for v in versions) or "unknown")
        + ". CPU float kernels differ between machines and training amplifies the difference, so another "
        "machine gives other numbers; a verdict drawn from one training seed can read otherwise there "
        "(docs/reliability.md)." + (f" The run: {run}." if run else "") + "\n",
    ]
    rows = {}
    found = sections(tables)
    if claims is not None:
        found.insert(1, ("Your claims", "Each claim of the config's `claims` block judged like the papers' "
                         "(canary_audit/claims/judge.py): the measured value with its seed-level CI, each seed's "
                         "value, the verdict (holds, fails, seed-dependent, below the floor, not measurable) and "
                         "what the planted control of its measure read.",
                         pl.read_csv(claims).select("id", "claim", "measure", "variants", "this_run", "verdict",
                                                    "why", "seeds", "per_seed", "planted", "floor")))
    for title, sentence, frame in found:
        parts.append(f"## {title}\n\n{sentence}\n\n{to_markdown(frame)}")
        rows[title] = frame.height
    try:
        figures = headline_figures(tables)
        parts.append(figures_markdown(figures))
    except NoHeadline as missing:  # another audit than the default: no README figures, said when asked for
        if readme is not None:
            raise NoHeadline(f"--readme {readme}: {missing}; drop --readme for this run") from None
    else:
        if readme is not None:
            write_readme(readme, figures, tables.parent / "plots")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts))
    return rows

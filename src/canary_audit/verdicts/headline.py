"""The figures the README's "A short result" quotes, computed from a run's
tables, and that section rendered from its template.

Prose typed beside numbers goes stale the moment a run changes them; here
the prose (verdicts/readme_result.md, `{figure}` placeholders) holds no number, and
every number is a function of the tables.  `python -m canary_audit summary`
lists the figures at the end of docs/results.md and, with `--readme`,
rewrites the README's section between its markers; a test renders the
template from the figures docs/results.md lists and compares it with the
README, so neither can drift from the other.

The template speaks of the default audit's two models, `tiny` (the text
model) and `tiny_vl` (the vision-language one), and its first seed.
"""

from __future__ import annotations

import re
import shutil
import string
import textwrap
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from canary_audit.verdicts.decision import HOLDS
from canary_audit.verdicts.judge import beside_ours
from canary_audit.verdicts.readings import Run, ci_text
from canary_audit.views.audit_bound import ANY
from canary_audit.views.seeds import family_of

TEMPLATE = Path(__file__).with_name("readme_result.md")
BEGIN = ("<!-- short result: written by `python -m canary_audit summary --tables results/seeds/tables "
         "--out docs/results.md --readme README.md` from a run's tables -->")
END = "<!-- end of the short result -->"
SECTION = "Figures the README quotes"
TEXT, VL = "tiny", "tiny_vl"


class NoHeadline(ValueError):
    """The run lacks what the README's short result reads: it is not a run
    of the default audit (a user's own audit, a config without a control)."""


def _sorted(values: Iterable[float]) -> list[float]:
    vals = sorted(float(v) for v in values)
    if not vals:
        raise NoHeadline("no values to quote: the run lacks a row the README's short result reads")
    return vals


def _span(values: Iterable[float], digits: int) -> str:
    """`lo-hi` of `values` at `digits` (one value when both ends round
    alike); `lo to hi` when a negative end would read as a dash."""
    vals = _sorted(values)
    lo, hi = (f"{v:.{digits}f}" for v in (vals[0], vals[-1]))
    if lo == hi:
        return lo
    return f"{lo} to {hi}" if vals[0] < 0 or vals[-1] < 0 else f"{lo}-{hi}"


def _signed_span(values: Iterable[float], digits: int) -> str:
    """`+lo to +hi` of `values` at `digits`, signs shown (PrivLeak)."""
    vals = _sorted(values)
    lo, hi = (f"{v:+.{digits}f}" for v in (vals[0], vals[-1]))
    return lo if lo == hi else f"{lo} to {hi}"


def _one(frame: pl.DataFrame, what: str) -> dict:
    if frame.height != 1:
        raise NoHeadline(f"the README's short result reads one row of {what}; the run has {frame.height}")
    return frame.row(0, named=True)


def _need(run: Run, name: str) -> pl.DataFrame:
    table = run.table(name)
    if table is None:
        raise NoHeadline(f"the README's short result reads the `{name}` table, which this run does not have "
                         "(the default audit's tables are the ones it quotes)")
    return table


def _of(variant: str) -> pl.Expr:
    return pl.col("variant") == variant


def _model(model: str) -> pl.Expr:
    return pl.col("variant").str.starts_with(f"{model}/")


def _sweep_figures(run: Run) -> dict[str, str]:
    """Paper A on the text model: out_acc along the BIO runs, the largest
    bypass gap, the paper's gap and verdict, the prefill arms."""
    sweep = _need(run, "k_sweep").filter((pl.col("model") == TEXT) & (pl.col("template") == "bio")
                                         & (pl.col("seed") == 0))
    out: dict[str, str] = {}
    for method in ("npo", "ga"):
        rows = sweep.filter(pl.col("run") == method).sort("k")
        out[f"{method}_bio_out_acc"] = " -> ".join(f"{v:.2f}" for v in rows["out_acc"])
    ks = sorted(k for k in sweep["k"].unique() if k > 0)
    out["ks"] = " and ".join(str(k) for k in ks)
    out["n_authors"] = str(sweep["n"].max())
    out["k_max"] = str(ks[-1])
    unlearned = sweep.filter(pl.col("k") > 0)
    widest = unlearned.sort("gap", descending=True).row(0, named=True)
    out["bio_gap"] = ci_text(widest, "gap")
    out["bio_gap_at"] = f"{widest['run'].upper()} at K = {widest['k']}"
    # paper A's gap is NPO's at its largest K: quoted beside that row's own gap and CI
    npo = _one(unlearned.filter((pl.col("run") == "npo") & (pl.col("k") == ks[-1])), "k_sweep for NPO at its largest K")
    papers = beside_ours(run.tables)
    gap = _one(papers.filter(pl.col("claim").str.starts_with("parser-split bypass gap")), "the bypass-gap claim")
    # the papers' page's own value: seed 0's row with one seed, pooled over the seeds with several
    out["npo_gap"] = ci_text(npo, "gap") if gap["seeds"] == 1 else gap["this_run"]
    out["seeds"] = ("one training seed" if gap["seeds"] == 1 else
                    f"{gap['seeds']} training seeds: the verdicts and the gap pooled over them, the other figures "
                    "seed 0's")
    out["paper_a_gap"] = gap["paper_value"].split(" ")[0]
    power = gap["power"] or ""
    detects = power.split(": ", 1)[1].split(" with ")[0] if ": " in power else ""
    needs = power.split("; the stated effect ", 1)[1].split(" ", 1)[1] if "; the stated effect " in power else ""
    out["paper_a_gap_verdict"] = (f"{gap['verdict']}" + (f", {gap['qualifier']}" if gap["qualifier"] else "")
                                  + (", borderline" if gap["borderline"] else "")
                                  + (f" (this run detects {detects} at 80% power; the paper's effect {needs})"
                                     if detects and needs else ""))
    out["npo_gap_per_seed"] = gap["per_seed"] or "one seed"
    out["gap_reading"] = ("the answer first, the trace after it" if gap["verdict"] == HOLDS
                          else "the answer and the trace, with no gap this run can show")
    arms = _one(_need(run, "prefill_arms").filter(_of(f"{TEXT}/mem-bio-s0")), f"prefill_arms for {TEXT}/mem-bio-s0")
    out["bio_auto"] = f"{arms['auto']:.2f}"
    out["bio_prefills"] = " / ".join(f"{arms[f'prefill_{a}']:.2f}" for a in ("bio", "empty", "meta"))
    return out


def _canary_figures(run: Run) -> dict[str, str]:
    """Paper B: the canary LoRA's recall and secret NLL, the bSFT grid's
    Deltas and diagnoses, merged against stacked."""
    recall = _need(run, "hex_recall")
    out: dict[str, str] = {}
    for model, modality in ((TEXT, "text"), (VL, "image"), (VL, "text")):
        row = _one(recall.filter(_of(f"{model}/canary-s0") & (pl.col("modality") == modality)),
                   f"hex_recall for {model}/canary-s0 ({modality})")
        out[f"hit1_{model}_{modality}"] = f"{round(row['hit_at_1'] * row['n'])} of {row['n']}"
    forgetting = _need(run, "forgetting")
    canary = forgetting.filter(pl.col("variant").str.ends_with("/canary-s0") & (pl.col("population") == "hex"))
    out["canary_nll_fall"] = _span(-canary["delta_nll_secret"], 1)
    matrix = _need(run, "bsft_matrix").filter(pl.col("canary_seed") == 0)
    bsft = matrix.filter(pl.col("kind") == "bsft")
    longest = bsft.filter(pl.col("step") == bsft["step"].max())
    out["bsft_steps"] = str(bsft["step"].max())
    out["bsft_window"] = _span(longest["delta_window"], 3)
    out["bsft_secret"] = _span(longest["delta_secret"], 3)
    n = _one(recall.filter(_of(f"{TEXT}/canary-s0")), f"hex_recall for {TEXT}/canary-s0")["n"]
    out["n_canaries"] = str(n)
    out["n_image_canaries"] = str(_one(recall.filter(_of(f"{VL}/canary-s0") & (pl.col("modality") == "image")),
                                       f"hex_recall for {VL}/canary-s0 (image)")["n"])
    # a Delta of hit@1 in canaries: each cell's share times its own model and modality's count
    counts_of = recall.filter(pl.col("variant").str.ends_with("/canary-s0")).select(
        model=pl.col("variant").str.split("/").list.first(), modality="modality", n="n")
    moved = bsft.join(counts_of, on=["model", "modality"], how="left")
    if moved["n"].null_count():
        raise NoHeadline("a bSFT cell's model and modality has no canary LoRA row in hex_recall")
    out["bsft_hit1_moved"] = str(round(float((moved["delta_hit1"].abs() * moved["n"]).max())))
    counts = dict(matrix.group_by("diagnosis").len().iter_rows())
    out["cells"] = str(matrix.height)
    out["inconclusive"] = str(counts.get("inconclusive", 0))
    out["agree"] = str(counts.get("agree", 0))
    out["unexplained"] = str(counts.get("unexplained disagreement", 0))
    pairs = _need(run, "bsft_merged_vs_stacked").filter(pl.col("canary_seed") == 0)
    drift = pairs.select(pl.max_horizontal(pl.col("delta_window_merged_minus_stacked").abs(),
                                           pl.col("delta_secret_merged_minus_stacked").abs()).max()).item()
    out["merge_nll"] = f"{drift:.0e}".replace("e-0", "e-")
    flips = pairs.filter(pl.col("hit1_merged_minus_stacked") != 0).height
    out["merge_hit1"] = "never in hit@1" if flips == 0 else f"in hit@1 in {flips} of {pairs.height} pairs"
    return out


def _measure_figures(run: Run) -> dict[str, str]:
    """The field's measures: Min-K%++ AUC and extrapolated exposure of the
    canary LoRA, its never-trained controls and its undertrained copy;
    NPO's authors; the blind-baseline guard."""
    forgetting, exposure = _need(run, "forgetting"), _need(run, "exposure")
    hexes = forgetting.filter(pl.col("population") == "hex")
    out: dict[str, str] = {}
    canary = hexes.filter(pl.col("variant").str.ends_with("/canary-s0"))
    out["canary_auc"] = _span(canary["auc_min_k_pp"], 2)
    out["canary_bits"] = _span(exposure.filter(pl.col("variant").str.ends_with("/canary-s0"))[
        "exposure_extrapolation"], 0)
    untrained = pl.col("variant").str.ends_with("/base") | pl.col("variant").str.contains("/reference-s")
    mia = _need(run, "mia").filter((pl.col("population") == "hex") & (pl.col("attack") == "min_k_pp") & untrained)
    out["untrained_auc"] = _span(mia["auc"], 2)
    out["untrained_bits"] = _span(exposure.filter(untrained)["exposure_extrapolation"], 1)
    recall = _need(run, "hex_recall").filter(pl.col("variant").str.ends_with("/canary-s0-under"))
    out["under_hits"] = _span(recall["hit_at_1"] * recall["n"], 0)
    for model in (TEXT, VL):
        under = hexes.filter(_of(f"{model}/canary-s0-under"))
        out[f"under_auc_{model}"] = _span(under["auc_min_k_pp"], 2)
        out[f"under_privleak_{model}"] = _signed_span(under["privleak_min_k"], 0) + "%"
        out[f"under_bits_{model}"] = _span(exposure.filter(_of(f"{model}/canary-s0-under"))[
            "exposure_extrapolation"], 0)
    head = run.headline()
    if head is None:
        raise NoHeadline("the README's short result reads NPO on the BIO template, which this run does not run")
    authors = forgetting.filter(_of(head[0]) & (pl.col("population") == "author"))
    out["npo_auc"] = _span(authors["auc_min_k_pp"], 2)
    # PrivLeak is refused (null) on an arm whose never-trained reference is shifted (privacy.py): said, not dropped
    kept, refused = authors["privleak_min_k"].drop_nulls(), authors["privleak_min_k"].null_count()
    out["npo_privleak"] = ((_signed_span(kept, 0) + "%" if kept.len() else "refused on every arm")
                           + (f" (refused on {refused} of {authors.height} arms: the never-trained reference is "
                              "shifted)" if refused and kept.len() else ""))
    guard = _need(run, "blind_baseline")
    out["guard_checks"] = str(guard["checks_in_run"][0])
    out["guard_failed"] = str(guard.filter(pl.col("failed")).height)
    out["guard_min_p"] = f"{guard['p_adjusted'].min():.2f}"
    refs = guard.filter((pl.col("population") == "author") & (pl.col("check") == "never-trained reference"))
    out["author_reference_auc"] = _span(refs["auc"], 2)
    return out


def _control_figures(run: Run) -> dict[str, str]:
    """The planted controls: how many positives were seen and negatives clean."""
    controls = _need(run, "controls")
    # every plant read once (a row per negative repeats its positive), none where no honest plant exists
    built = controls.filter(pl.col("positive_verdict") != "not built").unique(
        [c for c in ("model", "modality", "claim", "seed", "positive") if c in controls.columns])
    return {"planted": str(built.height),
            "planted_seen": str(built.filter(pl.col("positive_verdict") == "seen").height),
            "negatives": str(controls.height),
            "negatives_clean": str(controls.filter(pl.col("negative_verdict") == "clean").height)}


def _bound_figures(run: Run, members: str, k_max: str) -> dict[str, str]:
    """Who the run memorizes and, under coin inclusion (the only runs with an
    `audit_bound` table), what the one-run bound certifies over the seeds'
    pooled candidates: the memorized BIO adapter, NPO at its largest K and
    the never-trained references (empty without one)."""
    bound = run.table("audit_bound")
    if bound is None or bound.filter(pl.col("population") == "author").is_empty():
        return {"authors": f"{members} fictional authors", "bound_reading": ""}
    author = bound.filter((pl.col("population") == "author") & (pl.col("score") == ANY)
                          & pl.col("variant").str.starts_with(f"{TEXT}/"))
    # a family's pooled row, or where one seed ran the seed's own row, named by its family (views/seeds)
    fields = {name: run.variants.get(name, {}) for name in author["variant"]}
    family = {name: family_of(name, f["seed"]) if f.get("seed") is not None else name for name, f in fields.items()}
    pooled = author.filter(pl.col("seeds") == author["seeds"].max()).with_columns(
        family=pl.col("variant").replace_strict(family))
    mem = _one(pooled.filter(pl.col("family") == f"{TEXT}/mem-bio"), "the pooled bound of the memorized BIO adapter")
    npo = _one(pooled.filter(pl.col("family") == f"{TEXT}/npo-bio-k{k_max}"),
               f"the pooled bound of NPO at K = {k_max}")
    references = pooled.filter(pl.col("variant").str.contains("/reference-"))["epsilon_lower"]
    candidates = author.filter(pl.col("seeds") == 1)["candidates"].max()
    over = "one seed's" if mem["seeds"] == 1 else f"the {mem['seeds']} seeds'"
    return {"authors": f"the fictional authors a fair coin keeps of {candidates} candidates ({members} on seed 0, "
                       "the rest its non-members)",
            "bound_reading": f"Over {over} {mem['candidates']} coin-drawn candidates the "
                             f"one-run audit certifies epsilon >= {mem['epsilon_lower']:.2f} at 95% for the memorized "
                             f"BIO adapter ({mem['correct']} of {mem['guesses']} guesses right; the cap is "
                             f"{mem['cap']:.2f}), {npo['epsilon_lower']:.2f} for NPO at K = {k_max} and "
                             f"{_span(references, 2)} for the never-trained references."}


def headline_figures(tables: Path) -> dict[str, str]:
    """figure name -> its text, as the README quotes it; NoHeadline when the
    run is not one of the default audit's models and arms."""
    run = Run(tables)
    missing = [f"{model}/{v}" for model in (TEXT, VL) for v in ("canary-s0", "canary-s0-under")
               if f"{model}/{v}" not in run.variants]
    if missing:
        raise NoHeadline(f"the README's short result reads the default audit's canary LoRAs; this run has no {missing}")
    provenance = _need(run, "provenance")
    commits = sorted({v.rsplit(".git.", 1)[-1][:7] for v in provenance["code_version"] if ".git." in v})
    figures = {"code": ", ".join(commits) or "an uncommitted tree"}
    for part in (_sweep_figures, _canary_figures, _measure_figures, _control_figures):
        figures.update(part(run))
    figures.update(_bound_figures(run, figures.pop("n_authors"), figures["k_max"]))
    return figures


def placeholders(template: str) -> set[str]:
    """The figure names a template's `{...}` fields ask for."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def render(figures: dict[str, str], template: str | None = None) -> str:
    """The README's short result, markers included: the template's
    paragraphs filled in and wrapped at 78 columns (an image line stays
    whole)."""
    text = TEMPLATE.read_text() if template is None else template
    missing = placeholders(text) - set(figures)
    if missing:
        raise ValueError(f"{TEMPLATE.name} names figures the run does not give: {sorted(missing)}")
    # "K = 0" stays on one line: a line opening with "= 0" reads badly
    nbsp = "\u00a0"
    paragraphs = [p if p.startswith("![") else textwrap.fill(
        " ".join(p.split()).replace(" = ", f"{nbsp}={nbsp}"), 78, break_on_hyphens=False).replace(nbsp, " ")
        for p in text.format(**figures).strip().split("\n\n")]
    return "\n".join([BEGIN, "\n\n".join(paragraphs), END])


def figures_markdown(figures: dict[str, str]) -> str:
    """docs/results.md's last section: every figure, one row each."""
    rows = "\n".join(f"| {name} | {value} |" for name, value in figures.items())
    return (f"## {SECTION}\n\nThe README's short result is rendered from these (`canary_audit.verdicts.headline`).\n\n"
            f"| figure | value |\n|---|---|\n{rows}\n")


def figures_from_markdown(text: str) -> dict[str, str]:
    """The figures a results page lists (the inverse of figures_markdown)."""
    section = text.split(f"## {SECTION}\n", 1)
    if len(section) != 2:
        raise ValueError(f"the page has no `{SECTION}` section: regenerate it with `python -m canary_audit summary`")
    return dict(re.findall(r"^\| (\w+) \| (.*) \|$", section[1], re.M))


def readme_block(readme: str) -> str:
    """The README's short result, markers included."""
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"the README has no short-result markers ({BEGIN!r} ... {END!r})")
    return readme[start:stop + len(END)]


def write_readme(readme: Path, figures: dict[str, str], plots: Path) -> list[Path]:
    """Replace the README's short result by one rendered from `figures`, and
    the pictures it shows (`docs/<name>.png`, beside the README) by the
    run's own from `plots`; returns the pictures copied.  A picture the run
    did not draw is refused: the section says they come from that run."""
    text = readme.read_text()
    old = readme_block(text)  # no markers: refused before any picture is replaced
    block = render(figures)
    pictures = [readme.parent / p for p in re.findall(r"\]\((docs/[\w.-]+\.png)\)", block)]
    missing = [p.name for p in pictures if not (plots / p.name).is_file()]
    if missing:
        raise FileNotFoundError(f"the README's short result shows {missing}, which {plots} does not hold: run "
                                "the workflow's `plots` rule on that run first")
    for picture in pictures:
        picture.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plots / picture.name, picture)
    readme.write_text(text.replace(old, block))
    return pictures

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

from canary_audit.publish.catalog import registry
from canary_audit.verdicts.controls import FALSE_ALARM, MISSED
from canary_audit.verdicts.headline import NoHeadline, figures_markdown, headline_figures, write_readme
from canary_audit.verdicts.judge import beside_ours
from canary_audit.views.markdown import to_markdown
from canary_audit.views.table import read_table


def _read(tables: Path, name: str) -> pl.DataFrame | None:
    """A table, or None when the run has none or it is empty (an empty
    table's CSV has no header to read, or a header and no row)."""
    return read_table(tables / f"{name}.csv")


def ci_level(tables: Path) -> str:
    """The CI level the tables were computed at (`tables.bootstrap.level`),
    as the tables job recorded it in `view_config.json`, e.g. "95%"."""
    path = tables / "view_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the summary states the CI level the tables were computed "
                                "at; point --tables at a tables folder the workflow's `tables` rule wrote")
    return f"{json.loads(path.read_text())['bootstrap']['level']:.0%}"


def sections(tables: Path) -> list[tuple[str, str, pl.DataFrame]]:
    """(title, sentence, frame) of each section the run has: the papers'
    page, then each table's pages as its catalog entry declares them
    (views/table.Page), in their places."""
    ci = ci_level(tables)
    out = [("The papers' numbers beside this run", "Each headline number of paper A and paper B (a claim of "
            "canary_audit/verdicts/paper_a.yaml or paper_b.yaml, with where it stands in its paper, judged like "
            "any claim) beside this run's value from the table named in `source`. One rule decides every claim "
            "(docs/measures.md, \"The decision rule\"), a two-sided test at 5%: `holds` (the CI on the claim's side of "
            "its null; "
            "the qualifier compares it with the paper's effect), `contradicted` (on the other side, or inside an "
            "equivalence band), `inconclusive` (it covers the null; `power` says what the run could have seen, "
            "or its detection floor), `seed-dependent` (the seeds differ in direction by Gail and Simon's test) "
            "or `not testable`; `borderline` flags a CI end within the machine-drift margin of its threshold. "
            "Paper A's three value claims are one family, Holm-adjusted to a family-wise 5% (`p_holm`); the "
            "readings stand outside it. Value claims' CIs are seed-level (the seed x author layout, normal seed "
            f"effects assumed); the readings' are the tables' {ci} bootstrap CIs. The embedded model is a toy, "
            "the papers' are 7B: `small_telescopes` says whether this run's effect is too small for the paper "
            "to have seen. `planted` says what the claim's planted control read (the `controls` table, next).",
            beside_ours(tables))]
    pages = sorted(((page, table.name) for table in registry() for page in table.pages), key=lambda p: p[0].place)
    for page, name in pages:
        frame = _read(tables, name)
        section = page.section(frame, ci) if frame is not None else None
        if section is not None:
            out.append(section)
    return out


def failed_calibrations(tables: Path) -> list[str]:
    """The page's first warning: each planted control whose positive was
    missed or whose negative raised an alarm, with the claims it calibrates
    (their verdicts rest on an instrument that failed its check)."""
    controls = _read(tables, "controls")
    if controls is None:
        return []
    failed = controls.filter((pl.col("positive_verdict") == MISSED) | (pl.col("negative_verdict") == FALSE_ALARM))
    if failed.is_empty():
        return []
    lines = [f"- `{r['claim']}` on {r['model']}" + (f" seed {r['seed']}" if r.get("seed") is not None else "")
             + (f" ({r['modality']})" if r.get("modality") else "")
             + f": positive {r['positive_verdict']}, negative {r['negative_verdict']}; it calibrates "
             f"`{r['paper_id']}`" for r in failed.iter_rows(named=True)]
    return ["**Failed calibration.** A planted control read wrong in this run, so the verdicts of the claims it "
            "calibrates rest on an instrument that failed its own check:\n\n" + "\n".join(lines) + "\n"]


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
        *failed_calibrations(tables),
    ]
    rows = {}
    found = sections(tables)
    if claims is not None:
        found.insert(1, ("Your claims", "Each claim of the config's `claims` block judged like the papers' "
                         "(canary_audit/verdicts/judge.py), its value claims one family (Holm): the measured value "
                         "with its seed-level CI, each seed's value, the verdict (holds, contradicted, "
                         "inconclusive, seed-dependent, not testable; borderline beside it), what the run could "
                         "have seen and what the planted control of its measure read.",
                         pl.read_csv(claims).select("id", "claim", "measure", "variants", "this_run", "verdict",
                                                    "qualifier", "borderline", "why", "power", "p_holm", "seeds",
                                                    "per_seed", "planted")))
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

"""One judge for every claim: a researcher's own (the config's `claims:`
block, or a claim file given to `python -m canary_audit claims`) and the
papers' ten (the shipped claim files paper_a.yaml and paper_b.yaml, whose
verdicts are the papers' page).

A claim names a measure (measures.py), the variants it reads (a selector
over the variants' fields: model, kind, method, run, template, k, seed,
apply, and a bSFT cell's cell, source, step, application; `k: max` keeps
the largest K), the rows of the measure's table (`where`: arm, modality,
attack, ...), what it is compared with (`compare`: a number, `parent`,
`reference` or `{variants: selector}`) and what it expects (`higher`,
`lower`, `{value, tolerance}`; a reading measure: `read`).

Judging, from the tables alone:

- each training seed of the selection is read on its own CI: *with* the
  claim (its CI on the expected side of the comparison), *against* it (on
  the other side) or *neither* (the CI reaches it);
- the value is the seeds' pooled reading: the across_seeds row where the
  measure pools (a seed x item bootstrap), else the mean of the seeds with
  a t interval over them; one seed: that seed's own CI, labelled;
- `holds`: every seed reads with it and so does the pooled CI; `fails`: no
  seed does; `seed-dependent`: seeds read it on both sides, or only some
  do; `below the floor`: it fails where the measure's detection floor is
  above the effect the claim states (`effect_share`, a share of the
  canaries, or `effect_size`, in the unit of the measure's floor:
  controls.FLOOR_COMPOSED); `not measurable`: the
  run holds no row it needs (why says which);
- beside it, what the planted control of its measure read, and the floor.

Comparison with the parent uses the table's paired Delta (`delta_<column>`)
where it has one with a CI; otherwise (and for a reference or another
selector) the variant's CI against the other's point estimate, as paper A
reads its K sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from canary_audit.verdicts.claims import (
    Claim,
    ClaimError,
    check_selectors,
    fields_of,
    load,
    paper_claims,
    parse,
    select,
)
from canary_audit.verdicts.measures import MEASURES, Measure
from canary_audit.verdicts.papers import ONE_SEED, SEED_DEPENDENT, floor_note, planted
from canary_audit.verdicts.readings import NOT_MEASURABLE, NOT_REPRODUCED, SAME, Ours, Run
from canary_audit.views.markdown import to_markdown
from canary_audit.views.seeds import family_of

HOLDS, FAILS, SEEDS, FLOOR, UNMEASURABLE = "holds", "fails", "seed-dependent", "below the floor", "not measurable"
VERDICTS = (HOLDS, FAILS, SEEDS, FLOOR, UNMEASURABLE)
# The papers' page keeps the papers' words (verdicts/readings.py) for the same verdicts.
PAPER_WORDS = {HOLDS: SAME, FAILS: NOT_REPRODUCED, FLOOR: NOT_REPRODUCED, UNMEASURABLE: NOT_MEASURABLE,
               SEEDS: SEED_DEPENDENT}
FROM_READING = {SAME: HOLDS, NOT_REPRODUCED: FAILS, NOT_MEASURABLE: UNMEASURABLE, SEED_DEPENDENT: SEEDS}
@dataclass(frozen=True)
class Point:
    """One seed's reading of a value measure: the value, its CI and where from."""

    label: str
    value: float
    lo: float | None
    hi: float | None
    versus: float  # what it is compared with (0 for a paired Delta)
    source: str


def _side(point: Point, claim: Claim) -> int:
    """+1: the seed's CI on the claim's side; -1: on the other; 0: neither
    (or no CI to decide with)."""
    lo, hi = point.lo, point.hi
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return 0
    if isinstance(claim.expect, dict):
        low, high = claim.expect["value"] - claim.expect["tolerance"], claim.expect["value"] + claim.expect["tolerance"]
        lo, hi = lo - point.versus, hi - point.versus
        return 1 if low <= lo and hi <= high else -1 if hi < low or lo > high else 0
    above, below = lo > point.versus, hi < point.versus
    sign = 1 if claim.expect == "higher" else -1
    return sign if above else -sign if below else 0


@dataclass(frozen=True)
class Judged(Ours):
    """A reading's fields (value, verdict, why, source, seeds, per_seed) and,
    for a value measure, its estimate and seed-level CI as numbers."""

    estimate: float | None = None
    lo: float | None = None
    hi: float | None = None


def _row(run: Run, measure: Measure, claim: Claim, name: str) -> dict | None:
    rows = {**measure.rows, **claim.where}
    frame = run.table(measure.table)
    if frame is None:
        return None
    found = frame.filter(pl.col("variant") == name, *(pl.col(k).cast(pl.Utf8) == str(v) for k, v in rows.items()
                                                      if k in frame.columns))
    if found.height > 1:
        keys = [c for c in measure.where if c in found.columns and found[c].n_unique() > 1]
        raise ClaimError(f"`{claim.key}`: {found.height} rows of `{measure.table}` for {name}; set "
                         f"`{claim.key}.where` on {', '.join(keys) or 'its row keys'}")
    return found.row(0, named=True) if found.height else None


def _versus(run: Run, measure: Measure, claim: Claim, name: str, fields: dict) -> tuple[float, str, bool] | None:
    """(what `name` is compared with, its label, whether the comparison is
    the table's paired Delta), or None where the run lacks it."""
    compare, column = claim.compare, measure.column
    if compare is None:
        return 0.0, "", False
    if isinstance(compare, int | float):
        return float(compare), f"{compare}", False
    if compare == "parent":
        row = _row(run, measure, claim, name)
        if row and row.get(f"delta_{column}_lo") is not None and row.get(f"delta_{column}") is not None:
            return 0.0, "its parent (paired Delta)", True
        other = run.variants.get(name, {}).get("parent")
    elif compare == "reference":
        other = run.references.get(name, {}).get("reference")
    else:
        seed = fields[name].get("seed")
        matches = select(fields, compare["variants"])
        same_seed = [n for n in matches if fields[n].get("seed") == seed] or matches
        other = same_seed[0] if same_seed else None
    row = _row(run, measure, claim, other) if other else None
    if row is None or row.get(column) is None:
        return None
    return float(row[column]), other, False


def _value_measure(run: Run, measure: Measure, claim: Claim, fields: dict) -> Judged:
    names = select(fields, claim.variants)
    if not names:
        return Judged("", UNMEASURABLE, f"no variant of this run matches {claim.variants}", "view_config.json")
    families = {family_of(n, fields[n]["seed"]) if fields[n].get("seed") is not None else n for n in names}
    if len(families) > 1:
        raise ClaimError(f"`{claim.key}.variants` {claim.variants} selects {len(families)} variants per seed "
                         f"({', '.join(sorted(families)[:4])}); narrow it (e.g. k, run, template or variant)")
    points, missing = [], []
    for name in names:
        row = _row(run, measure, claim, name)
        past = _past_ceiling(measure, claim, row)
        if past:
            return Judged("", UNMEASURABLE, past, f"{measure.table}: {name}")
        versus = _versus(run, measure, claim, name, fields)
        if row is None or row.get(measure.column) is None or versus is None:
            missing.append(name)
            continue
        paired = versus[2]
        column = f"delta_{measure.column}" if paired else measure.column
        label = f"s{fields[name]['seed']}" if fields[name].get("seed") is not None else name
        points.append(Point(label, float(row[column]), row.get(f"{column}_lo"), row.get(f"{column}_hi"), versus[0],
                            f"{measure.table}: {name}" + (f" vs {versus[1]}" if versus[1] else "")))
    if not points:
        return Judged("", UNMEASURABLE, f"no `{measure.table}` row (or no comparison) for {', '.join(missing)}",
                      measure.table)
    sides = {p.label: _side(p, claim) for p in points}
    per_seed = "; ".join(f"{p.label}: {_ci(p.value, p.lo, p.hi)}" for p in points)
    if len(points) == 1:
        p = points[0]
        if p.lo is None or p.hi is None:
            return Judged(_ci(p.value, p.lo, p.hi), UNMEASURABLE,
                          f"`{measure.table}` gives no CI for {measure.column}: one seed has nothing to judge a "
                          "direction by (train several seeds, or name a measure with a CI)", p.source, 1, per_seed,
                          p.value)
        verdict = HOLDS if sides[p.label] > 0 else FAILS
        return Judged(_ci(p.value, p.lo, p.hi), verdict, _why(claim, sides[p.label], p.versus), p.source, 1, per_seed,
                      p.value, p.lo, p.hi)
    estimate, lo, hi, how = _pooled(run, measure, claim, names[0], points)
    pooled = _side(Point("pooled", estimate, lo, hi, points[0].versus, ""), claim)
    values = set(sides.values())
    if {1, -1} <= values:
        verdict, why = SEEDS, "the seeds disagree in direction (" + ", ".join(
            f"{k} {'with' if v > 0 else 'against'} the claim" for k, v in sides.items() if v) + ")"
    elif values == {1} and pooled > 0:
        verdict, why = HOLDS, f"every seed and the {how} read it"
    elif 1 in values or pooled > 0:
        verdict, why = SEEDS, (f"{sum(v > 0 for v in sides.values())} of {len(points)} seeds read it; the {how} "
                               + ("does" if pooled > 0 else "does not"))
    else:
        verdict, why = FAILS, f"no seed reads it; the {how} {_why(claim, pooled, points[0].versus)}"
    return Judged(f"{_ci(estimate, lo, hi)} over {len(points)} seeds", verdict, why, points[0].source, len(points),
                  per_seed, estimate, lo, hi)


def _past_ceiling(measure: Measure, claim: Claim, row: dict | None) -> str:
    """Why a claim stated at or past the measure's ceiling on this row
    cannot be judged by it ("" where it can): every value the measure reads
    lies at or below its ceiling, so "higher than" a number past it always
    fails and "lower than" it always holds, whatever the model did."""
    if measure.ceiling is None or row is None or row.get(measure.ceiling) is None:
        return ""
    stated = (claim.compare if isinstance(claim.compare, int | float) and not isinstance(claim.compare, bool)
              else claim.expect["value"] - claim.expect["tolerance"] if isinstance(claim.expect, dict) else None)
    ceiling = float(row[measure.ceiling])
    if stated is None or stated < ceiling:
        return ""
    other = MEASURES.get(measure.reaches) if measure.reaches else None
    reach = (f"; name `{other.name}` ({other.doc}), which reads up to {float(row[other.ceiling]):.3g}"
             if other and other.ceiling and row.get(other.ceiling) is not None else "; no measure reads past it")
    return (f"{stated:g} lies at or past `{measure.name}`'s ceiling on this row ({ceiling:.3g}, column "
            f"`{measure.ceiling}`): it cannot read a value above it{reach}")


def _pooled(run: Run, measure: Measure, claim: Claim, name: str,
            points: list[Point]) -> tuple[float, float, float, str]:
    """The seed-level estimate and CI: the across_seeds row (a seed x item
    bootstrap) where the measure pools and the claim compares with a fixed
    number, else a t interval over the seeds' points."""
    fixed = claim.compare is None or isinstance(claim.compare, int | float)
    row = run.pooled(name) if measure.pooled and fixed else None
    if row is not None and row.get(measure.pooled) is not None:
        return (row[measure.pooled], row[f"{measure.pooled}_lo"], row[f"{measure.pooled}_hi"],
                "pooled CI (seed x item bootstrap)")
    from scipy import stats

    values = [p.value for p in points]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = stats.t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half, "seed-level 95% t interval"


def _ci(value: float, lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return f"{value:.3g} (no CI)"
    return f"{value:.3g} [{lo:.3g}, {hi:.3g}]"


def _why(claim: Claim, side: int, versus: float) -> str:
    if isinstance(claim.expect, dict):
        band = f"{claim.expect['value']} +- {claim.expect['tolerance']}"
        return {1: f"CI within {band}", -1: f"CI outside {band}", 0: f"CI reaches past {band}"}[side]
    where = {1: "on the claim's side of", -1: "on the other side of", 0: "reaches"}[side]
    return f"the CI is {where} {versus:.3g} (expected {claim.expect})"


def judge(run: Run, claim: Claim, fields: dict | None = None) -> dict:
    """One claim's row of the claims table."""
    measure = MEASURES[claim.measure]
    fields = fields if fields is not None else fields_of(run.variants, run.cells)
    if measure.read is not None:
        ours = measure.read(run, select(fields, claim.variants), claim.variants)
        judged = Judged(ours.value, FROM_READING[ours.verdict], ours.why, ours.source, ours.seeds, ours.per_seed)
    else:
        judged = _value_measure(run, measure, claim, fields)
    verdict, why = judged.verdict, judged.why
    floor = ""
    if measure.floor:
        stated = claim.effect_share is not None or claim.effect_size is not None
        floor = (floor_note(run, measure.control, claim.effect_share, claim.effect_size) if stated
                 else "no effect_share or effect_size stated")
        if verdict == FAILS and stated:
            why += f"; {floor}"
            if " is below this run's detection floor" in floor:
                verdict = FLOOR
    if judged.seeds == 1 and verdict in (HOLDS, FAILS, FLOOR):
        why += f"; {ONE_SEED}"
    paper = claim.paper or {}
    return {"id": claim.id, "claim": claim.sentence, "measure": claim.measure,
            "variants": ", ".join(f"{k}={v}" for k, v in claim.variants.items()) or "all",
            "this_run": judged.value, "estimate": judged.estimate, "ci_lo": judged.lo, "ci_hi": judged.hi,
            "verdict": verdict, "why": why, "seeds": judged.seeds, "per_seed": judged.per_seed,
            "planted": planted(run, measure.control), "floor": floor, "source": judged.source,
            "paper": paper.get("name", ""), "paper_value": paper.get("value", ""), "where": paper.get("where", "")}


def claims_table(run: Run, claims: list[Claim]) -> pl.DataFrame:
    fields = fields_of(run.variants, run.cells)
    rows = [judge(run, c, fields) for c in claims]
    schema = {"estimate": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64, "seeds": pl.Int64}
    return pl.DataFrame(rows, schema_overrides=schema) if rows else pl.DataFrame()


def beside_ours(tables: Path) -> pl.DataFrame:
    """The papers' page: the shipped claims judged on this run, in the
    papers' words (a `below the floor` is the paper's `not reproduced`, its
    why naming the floor)."""
    table = claims_table(Run(tables), paper_claims())
    return table.select(
        "paper", "claim", pl.col("paper_value"), "where", "this_run",
        pl.col("verdict").replace_strict(PAPER_WORDS, return_dtype=pl.Utf8), "why", "seeds", "per_seed", "planted",
        "source")


def judge_results(results: Path, claims_file: Path | None = None, declared: list | None = None) -> pl.DataFrame:
    """The claims table of a finished run (the results folder holding
    tables/): the claims of `claims_file`, else the `declared` ones (the
    config's block); a selector matching no variant of the run is refused."""
    tables = Path(results) / "tables"
    if not (tables / "view_config.json").is_file():
        raise ClaimError(f"--results {results}: no tables/view_config.json there; give the results folder of a "
                         "finished run (the one holding tables/)")
    claims = load(claims_file) if claims_file else parse(declared or [])
    run = Run(tables)
    check_selectors(claims, fields_of(run.variants, run.cells))
    return claims_table(run, claims)


def write_claims(results: Path, claims_file: Path | None, declared: list, out: Path | None) -> tuple[str, dict]:
    """The claims command: the claims table of a finished run as Markdown
    and its verdict counts; with `out`, written there (CSV, .md beside it)."""
    table = judge_results(results, claims_file, declared)
    text = to_markdown(table) if table.height else "no claims declared\n"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.write_csv(out)
        out.with_suffix(".md").write_text(text)
    counts = {v: int((table["verdict"] == v).sum()) for v in table["verdict"].unique()} if table.height else {}
    return text, {"claims": table.height, **counts}

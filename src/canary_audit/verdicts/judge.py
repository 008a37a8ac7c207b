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

A value claim is decided by one rule (decision.py) on its seed-level
interval (evidence.py: the crossed seed x item layout where the run has
the measure's item cells, each seed's CI elsewhere), beside what the run
could see (power.py).  The value claims of one file are one family, judged
at a family-wise 5% by Holm.  A reading (the papers' composite measures)
keeps its own rule (papers.py) and stands outside the family; its words map
onto the same five verdicts: read -> holds; read against, its CI on the
other side -> contradicted (for a reading with a detection floor, only
where the stated effect lies above the floor); not read, but not against
-> inconclusive (`below the floor` where the floor is above the stated
effect); seeds
conclusively on both sides -> seed-dependent; unreadable -> not testable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from canary_audit.verdicts import drift, evidence
from canary_audit.verdicts.bound_claims import bound_evidence
from canary_audit.verdicts.claims import (
    Claim,
    ClaimError,
    check_selectors,
    fields_of,
    load,
    one_family,
    paper_claims,
    parse,
    select,
)
from canary_audit.verdicts.controls import RECOVERY_CONTROL_MEASURE, attack_control
from canary_audit.verdicts.decision import (
    ALPHA,
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTABLE,
    SEED_DEPENDENT,
    Claimed,
    Decision,
    decide,
    holm,
    p_value,
)
from canary_audit.verdicts.evidence import Evidence, Point
from canary_audit.verdicts.intervals import DIFFERENCE, RATE
from canary_audit.verdicts.measures import MEASURES, Measure
from canary_audit.verdicts.papers import ONE_SEED, floor_note, planted
from canary_audit.verdicts.readings import NOT_MEASURABLE, SAME, Ours, Run
from canary_audit.views.markdown import to_markdown

BELOW_FLOOR = "below the floor"
Z95 = evidence.Z95


@dataclass
class Pending:
    """A value claim between its evidence and its verdict (the family's
    Holm step needs every claim's p-value first)."""

    claim: Claim
    measure: Measure
    evidence: Evidence | None = None
    refused: str = ""  # why it is not testable
    source: str = ""
    paired_rate: bool = False  # a rate compared with another variant: its margin is the paired one


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


def _other(run: Run, claim: Claim, name: str, fields: dict) -> str | None:
    """The variant `name` is compared with (None for a number)."""
    if claim.compare == "parent":
        return run.variants.get(name, {}).get("parent")
    if claim.compare == "reference":
        return run.references.get(name, {}).get("reference")
    if isinstance(claim.compare, dict):
        seed = fields[name].get("seed")
        matches = select(fields, claim.compare["variants"])
        same_seed = [n for n in matches if fields[n].get("seed") == seed] or matches
        return same_seed[0] if same_seed else None
    return None


def claimed_of(claim: Claim) -> Claimed:
    """The claim's null, side, band and effect on the judged number's scale:
    the value itself against a number, a difference (0 = no change)
    against another variant.  `effect` is stated as the difference from the
    comparison the claim expects."""
    null = float(claim.compare) if isinstance(claim.compare, int | float) else 0.0
    effect = None if claim.effect is None else null + float(claim.effect)
    if isinstance(claim.expect, dict):
        value, tol = float(claim.expect["value"]), float(claim.expect["tolerance"])
        return Claimed(null, "within", (null + value - tol, null + value + tol), effect)
    return Claimed(null, claim.expect, None, effect, claim.equivalence)


def _cells_apply(run: Run, measure: Measure, claim: Claim) -> bool:
    """The item_cells table holds the measure's default rows only (AUTO;
    teacher-forced under the run's prefill contrast)."""
    if not measure.pooled or claim.where:
        return False
    arm = measure.rows.get("arm")
    return arm in (None, "auto") or arm == f"prefill_{run.contrast}"


def _se(lo, hi) -> float | None:
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return None
    return (hi - lo) / (2 * Z95)


def _point(run: Run, measure: Measure, claim: Claim, name: str, label: str, other: str | None) -> Point | str:
    """One seed's number from its table row: the paired Delta column against
    the parent where the table has one, else the value minus the compared
    variant's (their SEs combined as independent)."""
    row, column = _row(run, measure, claim, name), measure.column
    if row is None or row.get(column) is None:
        return f"no `{measure.table}` row for {name}"
    source = f"{measure.table}: {name}"
    c = f"delta_{column}"
    if claim.compare == "parent" and row.get(c) is not None and row.get(f"{c}_lo") is not None:
        return Point(label, float(row[c]), row[f"{c}_lo"], row[f"{c}_hi"], 0.0, f"{source} (paired Delta)")
    lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if other is None:
        return Point(label, float(row[column]), lo, hi, 0.0, source)
    versus = _row(run, measure, claim, other)
    if versus is None or versus.get(column) is None:
        return f"no `{measure.table}` row for {other}, the comparison of {name}"
    ses = [_se(lo, hi), _se(versus.get(f"{column}_lo"), versus.get(f"{column}_hi"))]
    if ses[0] is None:
        return Point(label, float(row[column]) - float(versus[column]), None, None, 0.0, source)
    se = math.sqrt(ses[0] ** 2 + (ses[1] or 0.0) ** 2)
    value = float(row[column]) - float(versus[column])
    return Point(label, value, value - Z95 * se, value + Z95 * se, 0.0, f"{source} vs {other}")


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


def gather(run: Run, claim: Claim, fields: dict) -> Pending:
    """A value claim's evidence, or why it is not testable."""
    measure = MEASURES[claim.measure]
    pending = Pending(claim, measure)
    names = select(fields, claim.variants)
    if not names:
        pending.refused, pending.source = f"no variant of this run matches {claim.variants}", "view_config.json"
        return pending
    one_family(claim, names, fields)
    for name in names:
        past = _past_ceiling(measure, claim, _row(run, measure, claim, name))
        if past:
            pending.refused, pending.source = past, f"{measure.table}: {name}"
            return pending
    if measure.bound:
        return _bound(run, pending, names, fields)
    others = {n: _other(run, claim, n, fields) for n in names}
    if claim.compare is not None and not isinstance(claim.compare, int | float) and None in others.values():
        missing = [n for n, o in others.items() if o is None]
        pending.refused, pending.source = f"no `{claim.compare}` variant for {', '.join(missing)}", measure.table
        return pending
    claimed = claimed_of(claim)
    labels = [f"s{fields[n]['seed']}" if fields[n].get("seed") is not None else n for n in names]
    paired = any(o is not None for o in others.values())
    pending.paired_rate = paired and measure.scale == RATE
    scale = DIFFERENCE if pending.paired_rate else measure.scale
    fallback = ""
    if _cells_apply(run, measure, claim):
        matrix = evidence.cell_matrix(run, measure.pooled, names, others if paired else None)
        if not isinstance(matrix, str):
            pending.evidence = evidence.from_cells(matrix, scale, claimed, labels,
                                                   f"{evidence.CELLS_TABLE}: {measure.pooled} of {', '.join(names)}"
                                                   + (f" minus {', '.join(others.values())}" if paired else ""))
            return pending
        fallback = f" ({matrix})"
    points = [_point(run, measure, claim, n, label, others[n]) for n, label in zip(names, labels, strict=True)]
    missing = [p for p in points if isinstance(p, str)]
    if missing:
        pending.refused, pending.source = "; ".join(missing), measure.table
        return pending
    found = evidence.from_points(points, scale, claimed)
    if isinstance(found, str):
        pending.refused, pending.source = found + fallback, measure.table
        return pending
    pending.evidence = found
    pending.source = found.source + fallback
    return pending


def _bound(run: Run, pending: Pending, names: list[str], fields: dict) -> Pending:
    """A claim on the one-run audit bound (bound_claims.py)."""
    claim, measure = pending.claim, pending.measure
    found = bound_evidence(run, claim, claimed_of(claim), measure.table, names, fields,
                           lambda name: _row(run, measure, claim, name))
    if isinstance(found, str):
        pending.refused = found
    else:
        pending.evidence = found
    pending.source = pending.source or measure.table
    return pending


def _control(claim: Claim, measure: Measure) -> tuple[str | None, str | None]:
    """The planted control that calibrates a claim, and the pattern of its positive's name: on attacked
    variants the attack's own control, read on out_acc only (controls.recovery_controls); else the measure's."""
    attack = attack_control(claim.variants)
    if attack is None:
        return measure.control, None
    return attack if measure.name == RECOVERY_CONTROL_MEASURE else (None, None)


def decide_family(pendings: list[Pending], family: str) -> list[tuple[Decision | None, float | None]]:
    """Each claim's decision, Holm-adjusted within the family, flagged
    borderline within its measure's margin (drift.py)."""
    stored = drift.load()
    ps = [p_value(p.evidence.interval, p.evidence.claimed) if p.evidence else None for p in pendings]
    tested = [j for j, p in enumerate(ps) if p is not None]
    adjusted = dict(zip(tested, holm([ps[j] for j in tested]), strict=True)) if tested else {}
    out = []
    for j, p in enumerate(pendings):
        if p.evidence is None:
            out.append((None, None))
            continue
        e = p.evidence
        label = f"{family}, {len(tested)} value claims" if len(tested) > 1 else ""
        margin = drift.margin_for(p.measure.name, p.paired_rate, stored)
        d = decide(e.interval, e.claimed, p_adjusted=adjusted[j] if len(tested) > 1 else None,
                   margin=margin or 0.0, heterogeneity=e.heterogeneity, adjusted=label)
        if margin is None:
            d = replace(d, borderline=None, why=f"{d.why}; no drift margin measured for `{p.measure.name}`")
        out.append((d, adjusted.get(j)))
    return out


def _value_row(p: Pending, decision: Decision | None, p_holm: float | None) -> dict:
    e, claim = p.evidence, p.claim
    if decision is None:
        return {"verdict": NOT_TESTABLE, "why": p.refused, "source": p.source, "seeds": None}
    lo, hi = e.interval.at(1 - ALPHA)
    why = decision.why + (f"; {ONE_SEED}" if e.seeds == 1 else "")
    return {"this_run": f"{e.interval.estimate:.3g} [{lo:.3g}, {hi:.3g}]"
                        + (f" over {e.seeds} seeds" if e.seeds > 1 else " (one seed)"),
            "estimate": e.interval.estimate, "ci_lo": lo, "ci_hi": hi, "verdict": decision.verdict,
            "qualifier": decision.qualifier, "borderline": decision.borderline, "why": why, "power": e.power,
            "p_value": decision.p_value, "p_holm": p_holm, "interval": e.interval.method,
            "heterogeneity": e.heterogeneity.text() if e.heterogeneity else "",
            "small_telescopes": evidence.small_telescopes(claim, e), "seeds": e.seeds, "per_seed": e.per_seed,
            "source": p.source or e.source}


def _reading_row(run: Run, claim: Claim, measure: Measure, fields: dict) -> dict:
    """A reading's verdict in the one vocabulary (its floor where it has one)."""
    ours: Ours = measure.read(run, select(fields, claim.variants), claim.variants)
    verdict = {SAME: HOLDS, NOT_MEASURABLE: NOT_TESTABLE, SEED_DEPENDENT: SEED_DEPENDENT}.get(ours.verdict)
    qualifier, why, power = "", ours.why, ""
    if verdict is None:  # NOT_REPRODUCED: against where its CI lies on the other side, else not seen
        verdict = CONTRADICTED if ours.against else INCONCLUSIVE
    if measure.floor:
        stated = claim.effect_share is not None or claim.effect_size is not None
        power = (floor_note(run, measure.control, claim.effect_share, claim.effect_size) if stated
                 else "no effect_share or effect_size stated to compare with the detection floor")
        # against the paper only where the run could have seen the paper's effect: stated above the floor
        if verdict == CONTRADICTED and " is above this run's detection floor" not in power:
            verdict = INCONCLUSIVE
        if verdict == INCONCLUSIVE and " is below this run's detection floor" in power:
            qualifier = BELOW_FLOOR
    elif verdict != NOT_TESTABLE:
        power = "a composite reading: no detection floor (its power is its CIs' width)"
    if ours.seeds == 1 and verdict in (HOLDS, CONTRADICTED, INCONCLUSIVE):
        why += f"; {ONE_SEED}"
    return {"this_run": ours.value, "verdict": verdict, "qualifier": qualifier, "why": why, "power": power,
            "interval": "the reading's own CIs (papers.py)", "seeds": ours.seeds, "per_seed": ours.per_seed,
            "source": ours.source}


COLUMNS = ("id", "claim", "measure", "variants", "this_run", "estimate", "ci_lo", "ci_hi", "verdict", "qualifier",
           "borderline", "why", "power", "p_value", "p_holm", "family", "interval", "heterogeneity",
           "small_telescopes", "seeds", "per_seed", "planted", "source", "paper", "paper_value", "where")
SCHEMA = {"estimate": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64, "borderline": pl.Boolean,
          "p_value": pl.Float64, "p_holm": pl.Float64, "seeds": pl.Int64}


def claims_table(run: Run, claims: list[Claim], family: str = "this claim file") -> pl.DataFrame:
    """The claims table: every claim's row, the value claims judged as one
    family (Holm), the readings outside it."""
    fields = fields_of(run.variants, run.cells)
    values = [c for c in claims if MEASURES[c.measure].read is None]
    pendings = {c.id: gather(run, c, fields) for c in values}
    decided = dict(zip(pendings, decide_family(list(pendings.values()), family), strict=True))
    rows = []
    for claim in claims:
        measure = MEASURES[claim.measure]
        if claim.id in pendings:
            row = _value_row(pendings[claim.id], *decided[claim.id])
            row["family"] = family if pendings[claim.id].evidence is not None else ""
        else:
            row = _reading_row(run, claim, measure, fields)
            row["family"] = "outside the family (a reading)"
        paper = claim.paper or {}
        row.update({"id": claim.id, "claim": claim.sentence, "measure": claim.measure,
                    "variants": ", ".join(f"{k}={v}" for k, v in claim.variants.items()) or "all",
                    "planted": planted(run, *_control(claim, measure)), "paper": paper.get("name", ""),
                    "paper_value": paper.get("text", ""), "where": paper.get("where", "")})
        rows.append({c: row.get(c) for c in COLUMNS})
    return pl.DataFrame(rows, schema_overrides=SCHEMA) if rows else pl.DataFrame()


def beside_ours(tables: Path) -> pl.DataFrame:
    """The papers' page: the shipped claims judged on this run, paper A's
    value claims one family."""
    table = claims_table(Run(tables), paper_claims(), family="the papers' value claims")
    return table.select("paper", "claim", "paper_value", "where", "this_run", "verdict", "qualifier", "borderline",
                        "why", "power", "p_holm", "small_telescopes", "seeds", "per_seed", "planted", "source")


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
    family = f"claims of {Path(claims_file).name}" if claims_file else "the config's claims"
    return claims_table(run, claims, family)


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

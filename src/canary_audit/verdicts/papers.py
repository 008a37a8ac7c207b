"""The papers' composite readings: each reads the variants a claim selects
(verdicts/judge.py; the shipped claim files verdicts/paper_a.yaml and paper_b.yaml) from a run's
tables into this run's value with its CI and a verdict:

- `same direction`: the run shows the paper's effect, its CI on the paper's
  side (effect sizes are not compared: a tiny CPU model is not a 7B one);
- `not reproduced`: the run measured it and does not show it (why: the
  estimate and its CI);
- `not measurable at this scale`: the run holds no case the measure needs
  (why: what is missing, e.g. no bypass case, no missing closing tag);
- `seed-dependent`: the run trained the arms the measure reads under several
  seeds (`audit.seeds`, `bsft.seeds`) and the seeds disagree in direction.

Where several seeds were trained, the verdict is the pooled reading (a CI
that resamples seeds as well as authors or canaries: `views/seeds.py`,
`paper_b.cell_probes`) and each seed's own reading stands beside it; with
one seed the page says the verdict is not shown to hold across seeds.

Every number on the page is either the data file's or a table's cell, named
in the `source` column.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from canary_audit.data.planted_controls import CLAIMS
from canary_audit.verdicts.decision import SEED_DEPENDENT
from canary_audit.verdicts.readings import (
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    SAME,
    Ours,
    Reading,
    Run,
    cell_text,
    ci_text,
    collapse_text,
    collapsed,
    echo,
    read_delta,
    read_gap,
    read_head_echo,
    read_parser_flip,
    read_tf_vs_greedy,
    read_unlearned,
    row_where,
    signed,
    sweep_rows,
)
from canary_audit.views.paper_b import INCONCLUSIVE, SPAN_DRIFT, UNDERTRAINED, WINDOW_TRUNCATION
from canary_audit.views.seeds import TABLE as SEED_TABLE

ONE_SEED = "one training seed: not shown to hold across seeds"


def _no_headline() -> Ours:
    return Ours("", NOT_MEASURABLE, "no NPO unlearning run of the BIO template in this run", "view_config.json")


def _head(run: Run, names: list[str]) -> tuple[str, str] | None:
    """(the first selected variant, its parent): the checkpoint a reading
    reads, its seed family beside it (the judge orders a selection by model,
    seed and largest K first)."""
    if not names:
        return None
    return names[0], run.variants[names[0]]["parent"]


def unlearned_out_acc(run: Run, names: list[str], selector: dict) -> Ours:
    head = _head(run, names)
    if head is None or run.table("k_sweep") is None:
        return _no_headline()
    name, parent = head

    def point(n: str) -> float | None:
        rows = sweep_rows(run, run.table("k_sweep"), n, [0, run.variants[n]["k"]])
        if rows.height < 2:
            return None
        before, after = rows.row(0, named=True), rows.row(-1, named=True)
        return _sided(before["out_acc"] - after["out_acc"], after["out_acc_hi"] < before["out_acc"],
                      after["out_acc_lo"] > before["out_acc"])

    def pooled(row: dict) -> Reading:
        before = run.pooled(parent)
        if before is None:
            return Reading("", None, f"no pooled row for {parent}", SEED_TABLE)
        effect = row["out_acc_hi"] < before["out_acc"]
        return Reading(f"{ci_text(before, 'out_acc')} -> {ci_text(row, 'out_acc')} over {row['seeds']} seeds",
                       effect, "the pooled K CI " + ("below" if effect else "reaches") +
                       " the pooled memorized out_acc", f"{SEED_TABLE}: {before['family']}, {row['family']}")

    return _seeds(run, name, lambda n: read_unlearned(run, n), point, pooled)


def across(readings: dict[str, Reading], pooled: Reading | None, directions: dict[str, float | None],
           primary: str | None = None) -> Ours:
    """One verdict from per-seed readings (label -> reading): one seed is
    that seed's verdict; several read `seed-dependent` where seeds lie
    conclusively on both sides (`directions`: > 0 a seed whose own CI is on
    the paper's side, < 0 one whose CI is on the other, 0 or None neither;
    a categorical reading is +1 read, -1 not read), and otherwise the `pooled` reading's
    verdict or, where nothing is pooled, the `primary` seed's reading (the
    variant the measure picked) when every seed reads the same; each seed's
    value stands beside it."""
    if len(readings) == 1:
        return next(iter(readings.values())).verdict()
    per_seed = "; ".join(f"{label}: {r.value}" for label, r in readings.items())
    signs = {d > 0 for d in directions.values() if d is not None and d != 0}
    base = pooled or readings.get(primary) or next(iter(readings.values()))
    if len(signs) > 1:
        sides = ", ".join(f"{label} {'with' if d > 0 else 'against'} the paper"
                          for label, d in directions.items() if d)
        return Ours(base.value, SEED_DEPENDENT, f"the seeds disagree in direction ({sides})", base.source,
                    len(readings), per_seed)
    effects = {r.effect for r in readings.values()}
    if pooled is None and len(effects - {None}) > 1:
        # some seeds read it, the others' CIs reach the null: no test of heterogeneity passes on that alone
        read = sum(bool(r.effect) for r in readings.values())
        return Ours(base.value, NOT_REPRODUCED, f"{read} of {len(readings)} seeds read it, the others' CIs reach "
                    "the null: not a difference between seeds by itself, and not pooled", base.source,
                    len(readings), per_seed)
    ours = base.verdict()
    how = (f"pooled over {len(readings)} seeds" if pooled is not None else
           f"every one of {len(readings)} seeds reads the same" if len(effects) == 1 else
           f"the seeds that read it agree, of {len(readings)}")
    return Ours(ours.value, ours.verdict, f"{ours.why} ({how})", ours.source, len(readings), per_seed, ours.against)


def _seeds(run: Run, name: str, read: Callable[[str], Reading], point: Callable[[str], float | None],
           pooled: Callable[[dict], Reading] | None) -> Ours:
    """`read` on `name` and each seed of its family, pooled by `pooled`
    from the across_seeds row where the run has one."""
    names = run.seeds_of(name)
    labels = {n: f"s{run.variants[n]['seed']}" if n in run.variants else n for n in names}
    row = run.pooled(name) if len(names) > 1 else None
    return across({labels[n]: read(n) for n in names}, pooled(row) if row and pooled else None,
                  {labels[n]: point(n) for n in names}, labels.get(name))


def _sided(point: float, with_paper: bool, against: bool) -> float:
    """A seed's direction for `across`: its point estimate where its own CI
    lies on one side of the null (`with_paper`, `against`), 0 where it
    straddles it (a seed whose CI covers 0 disagrees with no one)."""
    return point if with_paper or against else 0.0


def _point(run: Run, table: str, column: str, **where) -> Callable[[str], float | None]:
    """A variant's direction on `column` of `table`: its point estimate
    where its CI excludes 0, else 0."""
    def point(name: str) -> float | None:
        row = row_where(run.table(table), variant=name, **where)
        if row is None or row.get(column) is None:
            return None
        return _sided(row[column], row[f"{column}_lo"] > 0, row[f"{column}_hi"] < 0)
    return point


def _effect(read: Callable[[str], Reading]) -> Callable[[str], float | None]:
    """A reading's direction where it has no number of its own: +1 read,
    -1 read absent, None unreadable."""
    return lambda name: {True: 1.0, False: -1.0, None: None}[read(name).effect]


def _pooled_signed(column: str, label: str, family: str) -> Callable[[dict], Reading]:
    def read(row: dict) -> Reading:
        if row.get(column) is None:
            return Reading("", None, f"no pooled {column} for {family}", SEED_TABLE)
        verdict, why = signed(row, column, label)
        return Reading(f"{ci_text(row, column)} over {row['seeds']} seeds", verdict == SAME, why,
                       f"{SEED_TABLE}: {row['family']}")
    return read


def bypass_gap(run: Run, names: list[str], selector: dict) -> Ours:
    head = _head(run, names)
    if head is None:
        return _no_headline()
    return _seeds(run, head[0], lambda n: read_gap(run, n), _point(run, "canary_leakage", "gap", arm="auto"),
                  _pooled_signed("gap", "the pooled gap's", head[0]))


def delta_ab(run: Run, names: list[str], selector: dict) -> Ours:
    head = _head(run, names)
    if head is None:
        return _no_headline()
    return _seeds(run, head[0], lambda n: read_delta(run, n), _point(run, "prefill_arms", "delta_ab"),
                  _pooled_signed("delta_ab", "the pooled Delta_AB's", head[0]))


def parser_flip(run: Run, names: list[str], selector: dict) -> Ours:
    """Read on the selected audited variant with the most outputs missing
    the closing tag (never a planted control)."""
    conventions = run.table("parser_conventions")
    if conventions is None:
        return Ours("", NOT_MEASURABLE, "no parser_conventions table", "parser_conventions")
    audited = run.audited(conventions.filter(pl.col("variant").is_in(names)))
    if audited.is_empty():
        return Ours("", NOT_MEASURABLE, "no audited variant in parser_conventions", "parser_conventions")
    worst = audited.sort("missing_close", "variant", descending=[True, False]).row(0, named=True)
    read = lambda n: read_parser_flip(run, n)  # noqa: E731
    return _seeds(run, worst["variant"], read, _effect(read), None)


def head_echo_share(run: Run, names: list[str], selector: dict) -> Ours:
    """On the first selected checkpoint or, where it has no bypass case,
    pooled over the run's audited variants that have one (never a planted
    control)."""
    head, anatomy = _head(run, names), run.table("bypass_anatomy")
    if head is None or anatomy is None:
        return _no_headline()
    read = lambda n: read_head_echo(run, n)  # noqa: E731
    seeds = run.seeds_of(head[0])
    if any(read(n).effect is not None for n in seeds):
        def pooled(_row: dict) -> Reading:  # the seeds' bypass cases counted together
            rows = anatomy.filter(pl.col("variant").is_in(seeds) & (pl.col("bypass_cases") > 0))
            return echo(int(rows["prefix_only"].sum()), int(rows["bypass_cases"].sum()),
                        f"bypass_anatomy: {rows.height} seeds of {head[0]}, counted together")

        def direction(n: str) -> float | None:  # a seed against the paper only where its own CI says so
            r = read(n)
            return None if r.effect is None else 1.0 if r.effect else -1.0 if r.against else 0.0

        return _seeds(run, head[0], read, direction, pooled)
    pooled = run.audited(anatomy).filter(pl.col("bypass_cases") > 0)
    if pooled.is_empty():
        return Ours("0 bypass cases", NOT_MEASURABLE, "no audited variant of this run has a bypass case",
                    "bypass_anatomy")
    return echo(int(pooled["prefix_only"].sum()), int(pooled["bypass_cases"].sum()),
                 f"bypass_anatomy: pooled over {pooled.height} audited variants ({head[0]} has no bypass case)"
                 ).verdict()


def teacher_forced_vs_greedy(run: Run, names: list[str], selector: dict) -> Ours:
    head = _head(run, names)
    if head is None:
        return _no_headline()
    arm = f"prefill_{run.contrast}"

    def point(n: str) -> float | None:
        tf = row_where(run.table("teacher_forced_vs_greedy"), variant=n, arm=arm)
        auto = row_where(run.table("canary_leakage"), variant=n, arm="auto")
        if not (tf and auto):
            return None
        return _sided(tf["tf_top1_rate"] - auto["out_acc"], tf["tf_top1_rate_lo"] > auto["out_acc_hi"],
                      tf["tf_top1_rate_hi"] < auto["out_acc_lo"])

    def pooled(row: dict) -> Reading:
        if row.get("tf_top1_rate") is None:
            return Reading("", None, f"no pooled teacher-forced rate for {row['family']}", SEED_TABLE)
        reference = run.references.get(head[0], {}).get("reference")
        ref = run.pooled(reference) if reference else None
        above = row["tf_top1_rate_lo"] > row["out_acc_hi"] and (
            ref is None or ref.get("tf_top1_rate") is None or row["tf_top1_rate_lo"] > ref["tf_top1_rate_hi"])
        value = f"{ci_text(row, 'tf_top1_rate')} vs {ci_text(row, 'out_acc')} over {row['seeds']} seeds"
        if ref is not None and ref.get("tf_top1_rate") is not None:
            value += f" (reference {ci_text(ref, 'tf_top1_rate')})"
        return Reading(value, above, "the pooled top-1 CI " + ("above" if above else "not above") +
                       " greedy out_acc's and the reference's", f"{SEED_TABLE}: {row['family']}")

    return _seeds(run, head[0], lambda n: read_tf_vs_greedy(run, n, arm), point, pooled)


def _case(run: Run, diagnosis: str, selector: dict) -> Ours:
    """Whether some cell of the selected kind (`selector["kind"]`) reads `diagnosis`, on the cells with
    their bSFT seeds pooled (bsft_matrix) and, where several bSFT seeds ran,
    on each seed's runs (bsft_runs)."""
    kinds = [selector.get("kind", "bsft")]
    matrix = run.table("bsft_matrix")
    if matrix is None:
        return Ours("", NOT_MEASURABLE, "no bSFT cells in this run", "bsft_matrix")
    cells = matrix.filter(pl.col("kind").is_in(list(kinds)))
    found = cells.filter(pl.col("diagnosis") == diagnosis)
    if found.is_empty():
        seen = ", ".join(f"{d} x{n}" for d, n in cells.group_by("diagnosis").len().sort("diagnosis").rows())
        # against it only where every cell of the kind reads conclusively (none `inconclusive`)
        conclusive = cells.height and not cells.filter(pl.col("diagnosis") == INCONCLUSIVE).height
        pooled = Reading("not observed", False, f"no cell of the grid reads `{diagnosis}` (cells of this kind: "
                         f"{seen or 'none'})", "bsft_matrix: diagnosis", bool(conclusive))
    else:
        row = found.row(0, named=True)
        pooled = Reading(cell_text(row), True, f"{found.height} of {cells.height} cells read `{diagnosis}`",
                         f"bsft_matrix: {row['model']} {row['modality']} {row['cell']}")
    runs = run.table("bsft_runs")
    runs = runs.filter(pl.col("kind").is_in(list(kinds))) if runs is not None else None
    if runs is None or runs["bsft_seed"].n_unique() < 2:
        return pooled.verdict()
    readings = {}
    for (seed,), part in runs.group_by("bsft_seed", maintain_order=True):
        hits = part.filter(pl.col("diagnosis") == diagnosis).height
        readings[f"b{seed}"] = Reading(f"{hits} of {part.height} runs", hits > 0, "", "bsft_runs")
    readings = dict(sorted(readings.items()))
    return across(readings, pooled, {label: 1.0 if r.effect else -1.0 for label, r in readings.items()})


def case_window_truncation(run: Run, names: list[str], selector: dict) -> Ours:
    return _case(run, WINDOW_TRUNCATION, selector)


def case_span_drift(run: Run, names: list[str], selector: dict) -> Ours:
    return _case(run, SPAN_DRIFT, selector)


def case_undertrained(run: Run, names: list[str], selector: dict) -> Ours:
    return _case(run, UNDERTRAINED, selector)


def case_span_drift_merged(run: Run, names: list[str], selector: dict) -> Ours:
    runs = run.table("bsft_runs")
    seeds = runs["bsft_seed"].n_unique() if runs is not None else 1  # the cells pool them
    both = run.table("bsft_merged_vs_stacked")
    if both is None:
        return Ours("", NOT_MEASURABLE, "no merged-vs-stacked table (one application only)", "bsft_merged_vs_stacked",
                    seeds)
    drift = both.filter(pl.col("diagnosis_stacked") == SPAN_DRIFT)
    if drift.is_empty():
        return Ours("", NOT_MEASURABLE, "no stacked cell reads `non-secret span drift` to compare with its merge"
                    + (f" (cells pooled over {seeds} bSFT seeds)" if seeds > 1 else ""), "bsft_merged_vs_stacked",
                    seeds)
    row = drift.row(0, named=True)
    if row.get("merge_precision") == "float32":
        return Ours("", NOT_MEASURABLE, "a float32 merge keeps the whole update", "bsft_merged_vs_stacked", seeds)
    matrix, key = run.table("bsft_matrix"), {"model": row["model"], "modality": row["modality"]}
    stacked, merged = (row_where(matrix, **key, cell=f"{row['source']} t{row['step']} {app}")
                       for app in ("stacked", "merged"))
    if stacked is None or merged is None:
        return Ours("", NOT_MEASURABLE, "the pair's cells are not in bsft_matrix", "bsft_matrix", seeds)
    gone = collapsed(stacked, merged)
    if gone is None:
        return Ours(collapse_text(stacked, merged, row["merge_precision"]), NOT_MEASURABLE,
                    "the merged cell's mean-K CI straddles the threshold", "bsft_matrix", seeds)
    return Ours(collapse_text(stacked, merged, row["merge_precision"]), SAME if gone else NOT_REPRODUCED,
                ("the merged cell's mean-K no longer rises past the threshold" if gone
                 else "the merged cell's mean-K still rises past the threshold")
                + (f" (cells pooled over {seeds} bSFT seeds; no per-seed reading)" if seeds > 1 else ""),
                f"bsft_merged_vs_stacked: {row['model']} {row['modality']} {row['source']} t{row['step']}", seeds,
                against=not gone)


def planted(run: Run, control: str | None, positive: str | None = None) -> str:
    """What the run's planted control `control` (controls.CLAIMS key) read
    (controls table): "planted: seen / missed; negative: clean / false
    alarm", per model where several ran one; "no control" where none calibrates the measure or the run
    built none.  `positive`: a pattern the positive's name must match (a recovery attack's own rows)."""
    if control is None:
        return "no control for this measure"
    controls = run.table("controls")
    rows = controls.filter(pl.col("claim") == control, *([pl.col("positive").str.contains(positive)] if positive
                                                          else [])) if controls is not None else None
    if rows is None or rows.is_empty():
        return "no control in this run"
    # A paper B model whose plants the run left out is named, not covered by another's.
    uncalibrated = sorted({v["model"] for v in run.variants.values() if v.get("kind") == "bsft"}
                          - set(rows["model"])) if control in CLAIMS and CLAIMS[control].paper == "B" else []
    # A side per model and canary modality, named where several read one
    # (a controls table written before `modality` was a column names models only).
    keys = [k for k in ("model", "seed", "modality") if k in rows.columns and rows[k].n_unique() > 1]
    sides = rows.height > rows.unique([k for k in ("model", "seed", "modality") if k in rows.columns]).height
    parts = []
    for r in rows.iter_rows(named=True):  # several negatives of one claim: each named after the first
        head = " ".join(f"s{r[k]}" if k == "seed" else str(r[k]) for k in keys) + ": " if keys else ""
        if not (sides and parts and parts[-1][0] == head):
            parts.append((head, [f"planted: {r['positive_verdict']}"]))
        label = f"negative {r['negative'].split('/')[-1]}" if sides else "negative"
        parts[-1][1].append(f"{label}: {r['negative_verdict']}")
    text = ("" if not uncalibrated or "model" in keys else f"{rows['model'][0]}: ") + "; ".join(
        head + "; ".join(text) for head, text in parts)
    return text + "".join(f"; {m}: no control in this run (`controls.on_vision`)" for m in uncalibrated)


def floor_note(run: Run, control: str | None, effect_share: float | None = None,
               effect_size: float | None = None) -> str:
    """Whether a paper's effect, touching `effect_share` of the canaries or
    of size `effect_size` (the floor's unit: verdicts/controls.py), is above
    the run's detection floor for the claim `control` (detection_floor
    table: the least sensitive model's floor): below it,
    "not reproduced" cannot tell an absent effect from one too small to see."""
    floor = run.table("detection_floor")
    if floor is None:
        return "no detection floor in this run (`controls.detection_floor`)"
    rows = floor.filter(pl.col("claim") == control) if "claim" in floor.columns else floor
    if rows.is_empty():
        return f"no detection floor for this claim in this run (`{control}`)"
    if rows["floor_share"].null_count() == rows.height:
        return "the detector read none of this run's diluted plants: the floor is above every share planted"
    worst = rows.filter(pl.col("floor_share").is_not_null()).sort("floor_share").row(-1, named=True)
    n = f" of {worst['canaries']}" if worst.get("canaries") else ""
    if effect_size is not None:
        if worst.get("floor_effect") is None:
            return "this run's detection floor has no effect in the claim's unit (`floor_effect`) to compare with"
        side = "above" if effect_size >= worst["floor_effect"] else "below"
        return (f"the paper's effect ({effect_size:.4f}) is {side} this run's detection floor "
                f"({worst['floor_effect']:.4f}, at {worst['floor_share']:.0%}{n} canaries)")
    if effect_share is None:
        return "no effect_share or effect_size stated to compare with this run's detection floor"
    side = "above" if effect_share >= worst["floor_share"] else "below"
    return (f"the paper's effect ({effect_share:.0%} of the canaries) is {side} this run's detection floor "
            f"({worst['floor_share']:.0%})")

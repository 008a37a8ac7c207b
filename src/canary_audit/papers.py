"""The papers' headline numbers beside a run's own: each entry of
paper_numbers.yaml (the paper's value and where it stands) gets this run's
value with its CI, read from the run's tables by the function its `measure`
names, and a verdict:

- `same direction`: the run shows the paper's effect, its CI on the paper's
  side (effect sizes are not compared: a tiny CPU model is not a 7B one);
- `not reproduced`: the run measured it and does not show it (why: the
  estimate and its CI);
- `not measurable at this scale`: the run holds no case the measure needs
  (why: what is missing, e.g. no bypass case, no missing closing tag).

Every number on the page is either the data file's or a table's cell, named
in the `source` column.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from canary_audit.controls import CONTROL

NUMBERS = Path(__file__).with_name("paper_numbers.yaml")
SAME, NOT_REPRODUCED, NOT_MEASURABLE = "same direction", "not reproduced", "not measurable at this scale"
DEFAULT_SPLIT = "last"  # the parser splits at the last closing tag unless the view config says otherwise


@dataclass(frozen=True)
class Ours:
    value: str
    verdict: str
    why: str
    source: str


@dataclass(frozen=True)
class Reading:
    """What one reading of a claim finds on one variant: the value as text,
    whether the effect is read (True), read absent (False) or cannot be read
    (None: `why` says what is missing), and the table it comes from.  The
    papers' page and the planted controls read through the same functions."""

    value: str
    effect: bool | None
    why: str
    source: str

    def verdict(self) -> Ours:
        verdict = NOT_MEASURABLE if self.effect is None else SAME if self.effect else NOT_REPRODUCED
        return Ours(self.value, verdict, self.why, self.source)


class Run:
    """A run's tables (None when absent or empty) and the variant fields of
    its view config: read from a tables folder, or given in memory by the
    tables job (`frames`), which reads the planted controls through the same
    readings before it writes anything."""

    def __init__(self, tables: Path | None, config: dict | None = None,
                 frames: dict[str, pl.DataFrame] | None = None) -> None:
        self.tables, self.frames = tables, frames
        if config is None:
            config = json.loads((tables / "view_config.json").read_text())
        self.variants: dict[str, dict] = config.get("variants", {})
        self.references: dict[str, dict] = config.get("references", {})
        self.cells: dict[str, dict] = config.get("cells", {})
        self.split = config.get("parser", {}).get("split", DEFAULT_SPLIT)
        self.contrast = config.get("prefill_contrast", "bio")

    def table(self, name: str) -> pl.DataFrame | None:
        if self.frames is not None:
            frame = self.frames.get(name)
            return frame if frame is not None and frame.height else None
        path = self.tables / f"{name}.csv"
        return pl.read_csv(path) if path.is_file() and path.stat().st_size else None

    def audited(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The rows of the audit's own variants, imports included (never a
        planted control): what a measure that pools or picks among variants
        may read."""
        planted = [name for name, v in self.variants.items() if v.get("kind") == CONTROL]
        return frame.filter(~pl.col("variant").is_in(planted))

    def headline(self) -> tuple[str, str] | None:
        """(unlearned variant, its memorized parent): paper A's headline
        checkpoint, the NPO run of the BIO template at its largest K (first
        seed, first model)."""
        found = [(v["model"], v.get("seed", 0), -v.get("k", 0), name) for name, v in self.variants.items()
                 if v.get("kind") == "unlearned" and v.get("method") == "npo" and v.get("template") == "bio"]
        if not found:
            return None
        name = min(found)[3]
        return name, self.variants[name]["parent"]


def ci_text(row: dict, column: str, digits: int = 2) -> str:
    """A table row's `column` as `value [lo, hi]` (signed for gaps and
    Deltas), the value alone where the table has no CI for it."""
    value = f"{row[column]:+.{digits}f}" if column.startswith(("gap", "delta")) else f"{row[column]:.{digits}f}"
    if f"{column}_lo" in row and row[f"{column}_lo"] is not None:
        return f"{value} [{row[f'{column}_lo']:.{digits}f}, {row[f'{column}_hi']:.{digits}f}]"
    return value


def _signed(row: dict, column: str, label: str) -> tuple[str, str]:
    """Verdict and why for an effect the paper reports as positive."""
    lo, hi = row[f"{column}_lo"], row[f"{column}_hi"]
    if lo > 0:
        return SAME, f"{label} CI above 0"
    if hi < 0:
        return NOT_REPRODUCED, f"{label} CI below 0: the opposite direction"
    return NOT_REPRODUCED, f"{label} CI covers 0"


def _sweep(run: Run, sweep: pl.DataFrame, name: str, ks: list[int]) -> pl.DataFrame:
    """The K sweep rows of `name`'s run (its model, template, run and
    seed) at the `ks`, in K order."""
    v = run.variants[name]
    return sweep.filter((pl.col("model") == v["model"]) & (pl.col("template") == v["template"])
                        & (pl.col("run") == v["run"]) & (pl.col("seed") == v["seed"]) & pl.col("k").is_in(ks)
                        ).sort("k")


def _no_headline() -> Ours:
    return Ours("", NOT_MEASURABLE, "no NPO unlearning run of the BIO template in this run", "view_config.json")


def unlearned_out_acc(run: Run) -> Ours:
    head, sweep = run.headline(), run.table("k_sweep")
    if head is None or sweep is None:
        return _no_headline()
    name, _ = head
    k = run.variants[name]["k"]
    rows = _sweep(run, sweep, name, [0, k])
    before, after = rows.row(0, named=True), rows.row(-1, named=True)
    verdict = SAME if after["out_acc_hi"] < before["out_acc"] else NOT_REPRODUCED
    why = ("K=%d's CI below the memorized adapter's out_acc" if verdict == SAME else
           "K=%d's CI reaches the memorized adapter's out_acc") % k
    return Ours(f"{ci_text(before, 'out_acc')} -> {ci_text(after, 'out_acc')}", verdict, why,
                f"k_sweep: bio, {after['run']}, seed {after['seed']}, K=0 and K={k}")


def _row(frame: pl.DataFrame | None, **where) -> dict | None:
    """The one row of `frame` where every column equals its value, or None."""
    if frame is None:
        return None
    found = frame.filter(*(pl.col(c) == v for c, v in where.items()))
    return found.row(0, named=True) if found.height else None


def _missing(what: str, table: str) -> Reading:
    return Reading("", None, f"no {what} in this run", table)


def read_gap(run: Run, variant: str) -> Reading:
    """The bypass gap of `variant`'s AUTO arm (canary_leakage): read where its CI is above 0."""
    row = _row(run.table("canary_leakage"), variant=variant, arm="auto")
    if row is None:
        return _missing(f"AUTO arm of {variant}", "canary_leakage")
    verdict, why = _signed(row, "gap", "the gap's")
    return Reading(f"{ci_text(row, 'gap')} (thk_leak {row['thk_leak']:.2f}, out_acc {row['out_acc']:.2f})",
                   verdict == SAME, why, f"canary_leakage: {variant}, auto")


def read_delta(run: Run, variant: str, arm: str | None = None) -> Reading:
    """Delta = out_acc(AUTO) - out_acc(prefill `arm`) of `variant`
    (prefill_arms; the contrast arm's `delta_ab` without `arm`): read where
    its CI is above 0."""
    row, column = _row(run.table("prefill_arms"), variant=variant), f"delta_{arm}" if arm else "delta_ab"
    if row is None or row.get(column) is None:
        return _missing(f"{column} of {variant}", "prefill_arms")
    prefill = f"prefill_{arm or run.contrast}"
    verdict, why = _signed(row, column, "Delta's" if arm else "Delta_AB's")
    return Reading(f"{ci_text(row, column)} ({row['auto']:.2f} - {row[prefill]:.2f})", verdict == SAME, why,
                   f"prefill_arms: {variant}" + (f", {prefill}" if arm else ""))


def read_parser_flip(run: Run, variant: str) -> Reading:
    """Whether `variant`'s gap flips sign between the answer and trace
    fallbacks for a missing closing tag (parser_conventions): readable only
    where at least half its AUTO outputs lack the tag."""
    conventions = run.table("parser_conventions")
    names = {m: f"{run.split}-close/missing-as-{m}" for m in ("answer", "trace")}
    gaps = {m: _row(conventions, variant=variant, convention=c) for m, c in names.items()}
    if any(g is None for g in gaps.values()):
        return _missing(f"parser conventions of {variant}", "parser_conventions")
    missing = gaps["answer"]["missing_close"]
    source = f"parser_conventions: {variant} ({missing:.0%} missing)"
    if missing < 0.5:
        return Reading(f"missing closing tag on {missing:.0%} of AUTO outputs", None,
                       f"the flip needs outputs without the closing tag (paper: >= 60%); {variant} has {missing:.0%}",
                       source)
    flips = gaps["answer"]["gap_hi"] < 0 < gaps["trace"]["gap_lo"]
    return Reading(f"{ci_text(gaps['answer'], 'gap')} vs {ci_text(gaps['trace'], 'gap')}", flips,
                   "the two fallbacks' gap CIs lie on opposite sides of 0" if flips else "the CIs do not flip sign",
                   source)


def read_head_echo(run: Run, variant: str) -> Reading:
    """The share of `variant`'s bypass cases whose answer is only the
    question's canary head (bypass_anatomy): read where most are."""
    row = _row(run.table("bypass_anatomy"), variant=variant)
    if row is None or not row["bypass_cases"]:
        return Reading("0 bypass cases", None, f"{variant} has no bypass case", "bypass_anatomy")
    cases, echoes = int(row["bypass_cases"]), int(row["prefix_only"])
    return _echo(echoes, cases, f"bypass_anatomy: {variant}")


def _echo(echoes: int, cases: int, source: str) -> Reading:
    share = echoes / cases
    return Reading(f"{share:.2f} ({echoes} of {cases})", share > 0.5,
                   "most bypass answers echo the head" if share > 0.5 else "most bypass answers are not the head",
                   source)


def read_tf_vs_greedy(run: Run, variant: str, arm: str, reference: str | None = None) -> Reading:
    """Teacher-forced top-1 on `variant`'s canaries under prefill `arm`
    beside its greedy AUTO out_acc (teacher_forced_vs_greedy,
    canary_leakage): read where the top-1 CI is above out_acc's and above
    the never-trained reference's top-1 CI (the canaries are prose: a model
    that never saw them still predicts some of their tokens); `reference`
    names it where the run's references do not (a planted control)."""
    tf = run.table("teacher_forced_vs_greedy")
    row, auto = _row(tf, variant=variant, arm=arm), _row(run.table("canary_leakage"), variant=variant, arm="auto")
    if row is None or auto is None:
        return _missing(f"teacher-forced {arm} records of {variant}", "teacher_forced_vs_greedy")
    reference = reference or run.references.get(variant, {}).get("reference")
    ref = _row(tf, variant=reference, arm=arm) if reference else None
    above_greedy = row["tf_top1_rate_lo"] > auto["out_acc_hi"]
    above_ref = ref is None or row["tf_top1_rate_lo"] > ref["tf_top1_rate_hi"]
    value = f"{ci_text(row, 'tf_top1_rate')} vs {ci_text(auto, 'out_acc')}"
    if ref is not None:
        value += f" (reference {ci_text(ref, 'tf_top1_rate')})"
    why = ("teacher-forced top-1 CI above greedy out_acc's" if above_greedy else "the two CIs overlap")
    if ref is not None:
        why += " and above the never-trained reference's" if above_ref else " but not above the reference's"
    return Reading(value, above_greedy and above_ref, why,
                   f"teacher_forced_vs_greedy: {variant}, {arm}; canary_leakage: its AUTO out_acc")


def _cell_text(row: dict) -> str:
    return (f"Delta mean-K {ci_text(row, 'delta_window', 4)}, Delta secret {ci_text(row, 'delta_secret', 4)}, "
            f"hit@1 {row['ref_hit1']:.2f} -> {row['hit1']:.2f}")


def read_case(run: Run, variant: str, diagnosis: str) -> Reading:
    """The disagreement detector's reading of `variant`'s cell (bsft_matrix,
    its text canaries): read where it is `diagnosis`."""
    cell, matrix = run.cells.get(variant), run.table("bsft_matrix")
    row = _row(matrix, model=cell["model"], cell=cell["cell"], modality="text") if cell else None
    if row is None:
        return _missing(f"paper B cell of {variant}", "bsft_matrix")
    found = row["diagnosis"]
    why = f"the detector reads `{found}`" + (f" (inconclusive: {row['inconclusive_probes']})"
                                            if row.get("inconclusive_probes") else "")
    return Reading(f"{_cell_text(row)}; {found}", found == diagnosis, why,
                   f"bsft_matrix: {cell['model']} text {cell['cell']}")


def bypass_gap(run: Run) -> Ours:
    head = run.headline()
    return read_gap(run, head[0]).verdict() if head else _no_headline()


def delta_ab(run: Run) -> Ours:
    head = run.headline()
    return read_delta(run, head[0]).verdict() if head else _no_headline()


def parser_flip(run: Run) -> Ours:
    """Read on the audited variant with the most outputs missing the
    closing tag (never a planted control)."""
    conventions = run.table("parser_conventions")
    if conventions is None:
        return Ours("", NOT_MEASURABLE, "no parser_conventions table", "parser_conventions")
    audited = run.audited(conventions)
    if audited.is_empty():
        return Ours("", NOT_MEASURABLE, "no audited variant in parser_conventions", "parser_conventions")
    worst = audited.sort("missing_close", "variant", descending=[True, False]).row(0, named=True)
    return read_parser_flip(run, worst["variant"]).verdict()


def head_echo_share(run: Run) -> Ours:
    """On the headline checkpoint or, where it has no bypass case, pooled
    over the audited variants that have one (never a planted control)."""
    head, anatomy = run.headline(), run.table("bypass_anatomy")
    if head is None or anatomy is None:
        return _no_headline()
    reading = read_head_echo(run, head[0])
    if reading.effect is not None:
        return reading.verdict()
    pooled = run.audited(anatomy).filter(pl.col("bypass_cases") > 0)
    if pooled.is_empty():
        return Ours("0 bypass cases", NOT_MEASURABLE, "no audited variant of this run has a bypass case",
                    "bypass_anatomy")
    return _echo(int(pooled["prefix_only"].sum()), int(pooled["bypass_cases"].sum()),
                 f"bypass_anatomy: pooled over {pooled.height} audited variants ({head[0]} has no bypass case)"
                 ).verdict()


def teacher_forced_vs_greedy(run: Run) -> Ours:
    head = run.headline()
    return read_tf_vs_greedy(run, head[0], f"prefill_{run.contrast}").verdict() if head else _no_headline()


def _case(run: Run, diagnosis: str, kinds: tuple[str, ...]) -> Ours:
    matrix = run.table("bsft_matrix")
    if matrix is None:
        return Ours("", NOT_MEASURABLE, "no bSFT cells in this run", "bsft_matrix")
    cells = matrix.filter(pl.col("kind").is_in(list(kinds)))
    found = cells.filter(pl.col("diagnosis") == diagnosis)
    if found.is_empty():
        seen = ", ".join(f"{d} x{n}" for d, n in cells.group_by("diagnosis").len().sort("diagnosis").rows())
        return Ours("not observed", NOT_REPRODUCED, f"no cell of the grid reads `{diagnosis}` (cells of this kind: "
                    f"{seen or 'none'})", "bsft_matrix: diagnosis")
    row = found.row(0, named=True)
    return Ours(_cell_text(row), SAME, f"{found.height} of {cells.height} cells read `{diagnosis}`",
                f"bsft_matrix: {row['model']} {row['modality']} {row['cell']}")


def case_window_truncation(run: Run) -> Ours:
    return _case(run, "window truncation", ("bsft",))


def case_span_drift(run: Run) -> Ours:
    return _case(run, "non-secret span drift", ("bsft",))


def case_undertrained(run: Run) -> Ours:
    return _case(run, "undertrained ambiguity", ("undertrained",))


def case_span_drift_merged(run: Run) -> Ours:
    both = run.table("bsft_merged_vs_stacked")
    if both is None:
        return Ours("", NOT_MEASURABLE, "no merged-vs-stacked table (one application only)", "bsft_merged_vs_stacked")
    drift = both.filter(pl.col("diagnosis_stacked") == "non-secret span drift")
    if drift.is_empty():
        return Ours("", NOT_MEASURABLE, "no stacked cell reads `non-secret span drift` to compare with its merge",
                    "bsft_merged_vs_stacked")
    row = drift.row(0, named=True)
    if row.get("merge_precision") == "float32":
        return Ours("", NOT_MEASURABLE, "a float32 merge keeps the whole update", "bsft_merged_vs_stacked")
    collapsed = abs(row["delta_window_merged"]) < abs(row["delta_window_stacked"])
    return Ours(f"Delta mean-K stacked {row['delta_window_stacked']:+.4f}, merged {row['delta_window_merged']:+.4f} "
                f"({row['merge_precision']} merge)", SAME if collapsed else NOT_REPRODUCED,
                "the merged cell's drift is smaller" if collapsed else "the merged cell drifts as much",
                f"bsft_merged_vs_stacked: {row['model']} {row['modality']} {row['source']} t{row['step']}")


MEASURES: dict[str, Callable[[Run], Ours]] = {f.__name__: f for f in (
    unlearned_out_acc, bypass_gap, delta_ab, parser_flip, head_echo_share, teacher_forced_vs_greedy,
    case_window_truncation, case_span_drift, case_span_drift_merged, case_undertrained)}


def paper_numbers() -> list[dict]:
    """The data file's entries; each names a measure of MEASURES."""
    entries = yaml.safe_load(NUMBERS.read_text())
    unknown = [e["id"] for e in entries if e["measure"] not in MEASURES]
    if unknown:
        raise ValueError(f"{NUMBERS.name}: entries {unknown} name no measure of canary_audit.papers")
    return entries


def planted(run: Run, paper_id: str) -> str:
    """What the run's planted control of a paper number read (controls
    table): "planted: seen / missed; negative: clean / false alarm", per
    model where several ran one; "no control" where none calibrates it."""
    controls = run.table("controls")
    rows = controls.filter(pl.col("paper_id") == paper_id) if controls is not None else None
    if rows is None or rows.is_empty():
        return "no control in this run"
    many = rows["model"].n_unique() > 1
    return "; ".join((r["model"] + ": " if many else "") + f"planted: {r['positive_verdict']}; "
                     f"negative: {r['negative_verdict']}" for r in rows.iter_rows(named=True))


def floor_note(run: Run, effect_share: float) -> str:
    """Whether a paper's effect, touching `effect_share` of the canaries,
    is above the run's detection floor (detection_floor table): below it,
    "not reproduced" cannot tell an absent effect from one too small to see."""
    floor = run.table("detection_floor")
    if floor is None:
        return "no detection floor in this run (`controls.detection_floor`)"
    shares = floor["floor_share"].drop_nulls()
    if shares.is_empty():
        return "the detector read none of this run's diluted plants: the floor is above every share planted"
    lowest = shares.max()  # the least sensitive model's floor
    side = "above" if effect_share >= lowest else "below"
    return (f"the paper's effect ({effect_share:.0%} of the canaries) is {side} this run's detection floor "
            f"({lowest:.0%})")


def beside_ours(tables: Path) -> pl.DataFrame:
    """One row per paper number: the paper's value and where, this run's
    value, the verdict, why, the table it comes from, and what its planted
    control read (a "not reproduced" means something only where the planted
    effect was seen)."""
    run = Run(tables)
    rows = []
    for entry in paper_numbers():
        ours = MEASURES[entry["measure"]](run)
        why = ours.why
        if ours.verdict == NOT_REPRODUCED and "effect_share" in entry:
            why += f"; {floor_note(run, entry['effect_share'])}"
        rows.append({"paper": entry["paper"], "claim": entry["claim"], "paper_value": entry["value"],
                     "where": entry["where"], "this_run": ours.value, "verdict": ours.verdict, "why": why,
                     "planted": planted(run, entry["id"]), "source": ours.source})
    return pl.DataFrame(rows)

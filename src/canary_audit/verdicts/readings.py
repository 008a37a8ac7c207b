"""Readings of one claim on one variant, from a run's tables: each says what
it finds (a value with its CI), whether the effect is read, read absent or
cannot be read (and why), and the table it comes from.  The papers' page
(verdicts/papers.py) and the planted controls (verdicts/controls.py) read through the
same functions, so a control calibrates exactly the reading the page uses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from canary_audit.data.planted_controls import CONTROL
from canary_audit.model.quantize import RECOVERY, RECOVERY_PLANT
from canary_audit.verdicts.intervals import clopper_pearson
from canary_audit.views.paper_b import Verdicts
from canary_audit.views.seeds import TABLE as SEED_TABLE
from canary_audit.views.seeds import family_of
from canary_audit.views.table import read_table

SAME, NOT_REPRODUCED, NOT_MEASURABLE = "same direction", "not reproduced", "not measurable at this scale"


DEFAULT_SPLIT = "last"  # the parser splits at the last closing tag unless the view config says otherwise


@dataclass(frozen=True)
class Ours:
    value: str
    verdict: str
    why: str
    source: str
    seeds: int = 1
    per_seed: str = ""
    against: bool = False  # not read, and the data speaks against it (its CI wholly on the other side)


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
    against: bool = False  # not read, and conclusively so: its CI on the other side
    margin: float | None = None  # how far the CI end the reading turned on lies from its threshold (its unit)

    def verdict(self) -> Ours:
        """The verdict of this one reading (one seed: the page says so)."""
        verdict = NOT_MEASURABLE if self.effect is None else SAME if self.effect else NOT_REPRODUCED
        return Ours(self.value, verdict, self.why, self.source, against=self.against and not self.effect)


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
        # paper B's detector: tables.verdicts as the tables were built (its defaults where a config predates it)
        self.thresholds = asdict(Verdicts(**config.get("verdicts", {})))

    def table(self, name: str) -> pl.DataFrame | None:
        if self.frames is not None:
            frame = self.frames.get(name)
            return frame if frame is not None and frame.height else None
        return read_table(self.tables / f"{name}.csv")

    def audited(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The rows of the audit's own variants, imports included (never a
        planted control, nor a recovery attack's variant or plant: an
        attacked copy is not one of the papers' arms, and adding an attack
        must not move a paper's reading): what a measure that pools or picks
        among variants may read."""
        planted = [name for name, v in self.variants.items()
                   if v.get("kind") in (CONTROL, RECOVERY, RECOVERY_PLANT)]
        return frame.filter(~pl.col("variant").is_in(planted))

    def seeds_of(self, name: str) -> list[str]:
        """`name` and the variants that differ from it only in their
        training seed, in seed order (`name` alone when one seed ran)."""
        v = self.variants.get(name, {})
        if v.get("seed") is None:
            return [name]
        family = family_of(name, v["seed"])
        same = [(w["seed"], n) for n, w in self.variants.items()
                if w.get("kind") == v.get("kind") and w.get("seed") is not None and family_of(n, w["seed"]) == family]
        return [n for _, n in sorted(same)] or [name]

    def pooled(self, name: str) -> dict | None:
        """The across_seeds row of `name`'s family, or None."""
        v = self.variants.get(name, {})
        if v.get("seed") is None:
            return None
        return row_where(self.table(SEED_TABLE), family=family_of(name, v["seed"]))

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


def signed(row: dict, column: str, label: str) -> tuple[str, str]:
    """Verdict and why for an effect the paper reports as positive."""
    lo, hi = row[f"{column}_lo"], row[f"{column}_hi"]
    if lo > 0:
        return SAME, f"{label} CI above 0"
    if hi < 0:
        return NOT_REPRODUCED, f"{label} CI below 0: the opposite direction"
    return NOT_REPRODUCED, f"{label} CI covers 0"


def sweep_rows(run: Run, sweep: pl.DataFrame, name: str, ks: list[int]) -> pl.DataFrame:
    """The K sweep rows of `name`'s run (its model, template, run and
    seed) at the `ks`, in K order."""
    v = run.variants[name]
    return sweep.filter((pl.col("model") == v["model"]) & (pl.col("template") == v["template"])
                        & (pl.col("run") == v["run"]) & (pl.col("seed") == v["seed"]) & pl.col("k").is_in(ks)
                        ).sort("k")


def read_unlearned(run: Run, variant: str) -> Reading:
    """The AUTO out_acc of `variant`'s memorized adapter (K=0) and of
    `variant` on its run's K sweep: read where the latter's CI lies below
    the former."""
    sweep = run.table("k_sweep")
    if sweep is None:
        return not_in_run("K sweep", "k_sweep")
    k = run.variants[variant]["k"]
    rows = sweep_rows(run, sweep, variant, [0, k])
    if rows.height < 2:
        return not_in_run(f"K=0 and K={k} rows of {variant}", "k_sweep")
    before, after = rows.row(0, named=True), rows.row(-1, named=True)
    effect = after["out_acc_hi"] < before["out_acc"]
    why = ("K=%d's CI below the memorized adapter's out_acc" if effect else
           "K=%d's CI reaches the memorized adapter's out_acc") % k
    return Reading(f"{ci_text(before, 'out_acc')} -> {ci_text(after, 'out_acc')}", effect, why,
                   f"k_sweep: bio, {after['run']}, seed {after['seed']}, K=0 and K={k}",
                   after["out_acc_lo"] > before["out_acc"])


def row_where(frame: pl.DataFrame | None, **where) -> dict | None:
    """The one row of `frame` where every column equals its value, or None."""
    if frame is None:
        return None
    found = frame.filter(*(pl.col(c) == v for c, v in where.items()))
    return found.row(0, named=True) if found.height else None


def distance(row: dict, column: str, end: str, threshold: float = 0.0) -> float | None:
    """How far `row`'s CI end (`lo` or `hi`) of `column` lies from the
    threshold a reading compares it with: a control's margin.  None where
    the CI is a point at the threshold (every item reads the same value:
    no end to move by one item's drift, and no distance to print)."""
    lo, hi = row[f"{column}_lo"], row[f"{column}_hi"]
    if lo == hi == threshold:
        return None
    return abs(row[f"{column}_{end}"] - threshold)


def least(*margins: float | None) -> float | None:
    found = [m for m in margins if m is not None]
    return min(found) if found else None


def not_in_run(what: str, table: str) -> Reading:
    return Reading("", None, f"no {what} in this run", table)


def read_gap(run: Run, variant: str) -> Reading:
    """The bypass gap of `variant`'s AUTO arm (canary_leakage): read where its CI is above 0."""
    row = row_where(run.table("canary_leakage"), variant=variant, arm="auto")
    if row is None:
        return not_in_run(f"AUTO arm of {variant}", "canary_leakage")
    verdict, why = signed(row, "gap", "the gap's")
    return Reading(f"{ci_text(row, 'gap')} (thk_leak {row['thk_leak']:.2f}, out_acc {row['out_acc']:.2f})",
                   verdict == SAME, why, f"canary_leakage: {variant}, auto", row["gap_hi"] < 0,
                   distance(row, "gap", "lo"))


def read_delta(run: Run, variant: str, arm: str | None = None) -> Reading:
    """Delta = out_acc(AUTO) - out_acc(prefill `arm`) of `variant`
    (prefill_arms; the contrast arm's `delta_ab` without `arm`): read where
    its CI is above 0."""
    row, column = row_where(run.table("prefill_arms"), variant=variant), f"delta_{arm}" if arm else "delta_ab"
    if row is None or row.get(column) is None:
        return not_in_run(f"{column} of {variant}", "prefill_arms")
    prefill = f"prefill_{arm or run.contrast}"
    verdict, why = signed(row, column, "Delta's" if arm else "Delta_AB's")
    return Reading(f"{ci_text(row, column)} ({row['auto']:.2f} - {row[prefill]:.2f})", verdict == SAME, why,
                   f"prefill_arms: {variant}" + (f", {prefill}" if arm else ""), row[f"{column}_hi"] < 0,
                   distance(row, column, "lo"))


def read_parser_flip(run: Run, variant: str) -> Reading:
    """Whether `variant`'s gap flips sign between the answer and trace
    fallbacks for a missing closing tag (parser_conventions): readable only
    where at least half its AUTO outputs lack the tag."""
    conventions = run.table("parser_conventions")
    names = {m: f"{run.split}-close/missing-as-{m}" for m in ("answer", "trace")}
    gaps = {m: row_where(conventions, variant=variant, convention=c) for m, c in names.items()}
    if any(g is None for g in gaps.values()):
        return not_in_run(f"parser conventions of {variant}", "parser_conventions")
    missing = gaps["answer"]["missing_close"]
    source = f"parser_conventions: {variant} ({missing:.0%} missing)"
    if missing < 0.5:
        return Reading(f"missing closing tag on {missing:.0%} of AUTO outputs", None,
                       f"the flip needs outputs without the closing tag (paper: >= 60%); {variant} has {missing:.0%}",
                       source)
    flips = gaps["answer"]["gap_hi"] < 0 < gaps["trace"]["gap_lo"]
    same_side = all(g["gap_lo"] > 0 for g in gaps.values()) or all(g["gap_hi"] < 0 for g in gaps.values())
    return Reading(f"{ci_text(gaps['answer'], 'gap')} vs {ci_text(gaps['trace'], 'gap')}", flips,
                   "the two fallbacks' gap CIs lie on opposite sides of 0" if flips else
                   "both fallbacks' gap CIs lie on one side of 0: no flip" if same_side else
                   "the CIs do not flip sign", source, same_side,
                   least(distance(gaps["answer"], "gap", "hi"), distance(gaps["trace"], "gap", "lo")))


def read_head_echo(run: Run, variant: str) -> Reading:
    """The share of `variant`'s bypass cases whose answer is only the
    question's canary head (bypass_anatomy): read where most are."""
    row = row_where(run.table("bypass_anatomy"), variant=variant)
    if row is None or not row["bypass_cases"]:
        return Reading("0 bypass cases", None, f"{variant} has no bypass case", "bypass_anatomy")
    cases, echoes = int(row["bypass_cases"]), int(row["prefix_only"])
    return echo(echoes, cases, f"bypass_anatomy: {variant}")


def echo(echoes: int, cases: int, source: str) -> Reading:
    """Read where the share's Clopper-Pearson 95% CI lies above one half
    ("most"), read against where it lies below."""
    share = echoes / cases
    lo, hi = clopper_pearson(echoes, cases)
    value = f"{share:.2f} [{lo:.2f}, {hi:.2f}] ({echoes} of {cases}; Clopper-Pearson)"
    why = ("the share's CI lies above one half: most bypass answers echo the head" if lo > 0.5 else
           "the share's CI lies below one half: most bypass answers are not the head" if hi < 0.5 else
           "the share's CI covers one half")
    return Reading(value, lo > 0.5, why, source, hi < 0.5, abs(lo - 0.5))


def read_tf_vs_greedy(run: Run, variant: str, arm: str, reference: str | None = None) -> Reading:
    """Teacher-forced top-1 on `variant`'s canaries under prefill `arm`
    beside its greedy AUTO out_acc (teacher_forced_vs_greedy,
    canary_leakage): read where the top-1 CI is above out_acc's and above
    the never-trained reference's top-1 CI (the canaries are prose: a model
    that never saw them still predicts some of their tokens); `reference`
    names it where the run's references do not (a planted control)."""
    tf = run.table("teacher_forced_vs_greedy")
    row = row_where(tf, variant=variant, arm=arm)
    auto = row_where(run.table("canary_leakage"), variant=variant, arm="auto")
    if row is None or auto is None:
        return not_in_run(f"teacher-forced {arm} records of {variant}", "teacher_forced_vs_greedy")
    reference = reference or run.references.get(variant, {}).get("reference")
    ref = row_where(tf, variant=reference, arm=arm) if reference else None
    above_greedy = row["tf_top1_rate_lo"] > auto["out_acc_hi"]
    above_ref = ref is None or row["tf_top1_rate_lo"] > ref["tf_top1_rate_hi"]
    value = f"{ci_text(row, 'tf_top1_rate')} vs {ci_text(auto, 'out_acc')}"
    if ref is not None:
        value += f" (reference {ci_text(ref, 'tf_top1_rate')})"
    why = ("teacher-forced top-1 CI above greedy out_acc's" if above_greedy else "the two CIs overlap")
    if ref is not None:
        why += " and above the never-trained reference's" if above_ref else " but not above the reference's"
    ends = [row["tf_top1_rate_lo"] - auto["out_acc_hi"]] + ([] if ref is None else
                                                           [row["tf_top1_rate_lo"] - ref["tf_top1_rate_hi"]])
    return Reading(value, above_greedy and above_ref, why,
                   f"teacher_forced_vs_greedy: {variant}, {arm}; canary_leakage: its AUTO out_acc",
                   row["tf_top1_rate_hi"] < auto["out_acc_lo"], min(abs(e) for e in ends))


def cell_text(row: dict) -> str:
    return (f"Delta mean-K {ci_text(row, 'delta_window', 4)}, Delta secret {ci_text(row, 'delta_secret', 4)}, "
            f"hit@1 {row['ref_hit1']:.2f} -> {row['hit1']:.2f}")


def read_case(run: Run, variant: str, diagnosis: str, modality: str = "text") -> Reading:
    """The disagreement detector's reading of `variant`'s cell (bsft_matrix)
    on its canaries of `modality` (text, or image on a vision-language
    model): read where it is `diagnosis`."""
    cell, matrix = run.cells.get(variant), run.table("bsft_matrix")
    row = row_where(matrix, model=cell["model"], cell=cell["cell"], modality=modality) if cell else None
    if row is None:
        return not_in_run(f"paper B cell of {variant} ({modality} canaries)", "bsft_matrix")
    found = row["diagnosis"]
    why = f"the detector reads `{found}`" + (f" (inconclusive: {row['inconclusive_probes']})"
                                            if row.get("inconclusive_probes") else "")
    return Reading(f"{cell_text(row)}; {found}", found == diagnosis, why,
                   f"bsft_matrix: {cell['model']} {modality} {cell['cell']}",
                   margin=cell_margin(row, run.thresholds))


CELL_PROBES = {"delta_window": "delta_nll", "delta_secret": "delta_nll", "delta_hit1": "hit_rate"}


def cell_margin(row: dict, thresholds: dict, probes=tuple(CELL_PROBES)) -> float | None:
    """How near a bSFT cell's reading is to flipping, as a share of its
    threshold: over its probes, the least distance of a CI end from the
    threshold (+- tables.verdicts) each probe's verdict compares it with,
    divided by that threshold (nats and hit shares on one scale)."""
    shares = []
    for probe in probes:
        lo, hi, t = row.get(f"{probe}_lo"), row.get(f"{probe}_hi"), thresholds.get(CELL_PROBES[probe])
        if lo is None or hi is None or not t:
            continue
        shares.append(min(abs(end - side * t) for end in (lo, hi) for side in (1, -1)) / t)
    return min(shares) if shares else None


def collapsed(stacked: dict, merged: dict) -> bool | None:
    """Paper B's C4 merge collapse, on two cells of one adapter (bsft_matrix
    rows): the stacked cell's mean-K rises conclusively past the threshold
    (`v_window` up) and the merged one's conclusively does not (flat or
    down: True) or still does (up: False).  None where it cannot be read:
    the stacked cell has no drift to lose, or the merged one's CI straddles
    the threshold."""
    if stacked.get("v_window") != "up" or merged.get("v_window") not in ("up", "flat", "down"):
        return None
    return merged["v_window"] != "up"


def collapse_text(stacked: dict, merged: dict, precision: str) -> str:
    return (f"Delta mean-K stacked {ci_text(stacked, 'delta_window', 4)}, merged {ci_text(merged, 'delta_window', 4)} "
            f"({precision} merge)")


def read_merge_collapse(run: Run, merged: str, stacked: str, precision: str, modality: str = "text") -> Reading:
    """Whether the cell of `merged` (an adapter merged into the base, its sum
    rounded into `precision`) lost the mean-K drift the same adapter shows
    stacked (`stacked`'s cell): `collapsed`."""
    matrix = run.table("bsft_matrix")
    rows = {}
    for name in (stacked, merged):
        cell = run.cells.get(name)
        rows[name] = row_where(matrix, model=cell["model"], cell=cell["cell"], modality=modality) if cell else None
        if rows[name] is None:
            return not_in_run(f"paper B cell of {name} ({modality} canaries)", "bsft_matrix")
    s, m = rows[stacked], rows[merged]
    gone = collapsed(s, m)
    why = (f"stacked mean-K reads `{s['v_window']}`, merged `{m['v_window']}`: "
           + {True: "the merge lost the drift", False: "not collapsed",
              None: "no conclusive drift on both sides to compare"}[gone])
    return Reading(collapse_text(s, m, precision), gone, why,
                   f"bsft_matrix: {run.cells[merged]['model']} {modality} {run.cells[merged]['cell']}", gone is False,
                   min((x for r in (s, m) if (x := cell_margin(r, run.thresholds, ("delta_window",))) is not None),
                       default=None))

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

NUMBERS = Path(__file__).with_name("paper_numbers.yaml")
SAME, NOT_REPRODUCED, NOT_MEASURABLE = "same direction", "not reproduced", "not measurable at this scale"
DEFAULT_SPLIT = "last"  # the parser splits at the last closing tag unless the view config says otherwise


@dataclass(frozen=True)
class Ours:
    value: str
    verdict: str
    why: str
    source: str


class Run:
    """A run's tables folder: its tables (None when absent or empty) and
    the variant fields of its view config."""

    def __init__(self, tables: Path) -> None:
        self.tables = tables
        config = json.loads((tables / "view_config.json").read_text())
        self.variants: dict[str, dict] = config.get("variants", {})
        self.split = config.get("parser", {}).get("split", DEFAULT_SPLIT)

    def table(self, name: str) -> pl.DataFrame | None:
        path = self.tables / f"{name}.csv"
        return pl.read_csv(path) if path.is_file() and path.stat().st_size else None

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


def bypass_gap(run: Run) -> Ours:
    head, sweep = run.headline(), run.table("k_sweep")
    if head is None or sweep is None:
        return _no_headline()
    fields = run.variants[head[0]]
    row = _sweep(run, sweep, head[0], [fields["k"]]).row(0, named=True)
    verdict, why = _signed(row, "gap", "the gap's")
    return Ours(f"{ci_text(row, 'gap')} (thk_leak {row['thk_leak']:.2f}, out_acc {row['out_acc']:.2f})", verdict, why,
                f"k_sweep: bio, {fields['run']}, seed {fields['seed']}, K={fields['k']}")


def delta_ab(run: Run) -> Ours:
    head, arms = run.headline(), run.table("prefill_arms")
    if head is None or arms is None:
        return _no_headline()
    row = arms.filter(pl.col("variant") == head[0]).row(0, named=True)
    verdict, why = _signed(row, "delta_ab", "Delta_AB's")
    return Ours(f"{ci_text(row, 'delta_ab')} ({row['auto']:.2f} - {row['prefill_bio']:.2f})", verdict, why,
                f"prefill_arms: {head[0]}")


def parser_flip(run: Run) -> Ours:
    conventions = run.table("parser_conventions")
    if conventions is None:
        return Ours("", NOT_MEASURABLE, "no parser_conventions table", "parser_conventions")
    names = {m: f"{run.split}-close/missing-as-{m}" for m in ("answer", "trace")}
    wide = conventions.filter(pl.col("convention").is_in(list(names.values())))
    worst = wide.sort("missing_close", descending=True).row(0, named=True)
    if worst["missing_close"] < 0.5:
        return Ours(f"missing closing tag on at most {worst['missing_close']:.0%} of AUTO outputs", NOT_MEASURABLE,
                    f"the flip needs outputs without </think> (paper: >= 60%); the most in this run is "
                    f"{worst['missing_close']:.0%} ({worst['variant']})", "parser_conventions: missing_close")
    variant = worst["variant"]
    gaps = {m: wide.filter((pl.col("variant") == variant) & (pl.col("convention") == c)).row(0, named=True)
            for m, c in names.items()}
    flips = gaps["answer"]["gap_hi"] < 0 < gaps["trace"]["gap_lo"]
    return Ours(f"{ci_text(gaps['answer'], 'gap')} vs {ci_text(gaps['trace'], 'gap')}",
                SAME if flips else NOT_REPRODUCED,
                "the two fallbacks' gap CIs lie on opposite sides of 0" if flips else "the CIs do not flip sign",
                f"parser_conventions: {variant} ({worst['missing_close']:.0%} missing)")


def head_echo_share(run: Run) -> Ours:
    head, anatomy = run.headline(), run.table("bypass_anatomy")
    if head is None or anatomy is None:
        return _no_headline()
    row = anatomy.filter(pl.col("variant") == head[0]).row(0, named=True)
    if not row["bypass_cases"]:
        pooled = anatomy.filter(pl.col("bypass_cases") > 0)
        if pooled.is_empty():
            return Ours("0 bypass cases", NOT_MEASURABLE, "no variant of this run has a bypass case",
                        "bypass_anatomy")
        cases, echoes = int(pooled["bypass_cases"].sum()), int(pooled["prefix_only"].sum())
        source = f"bypass_anatomy: pooled over {pooled.height} variants ({head[0]} has no bypass case)"
    else:
        cases, echoes, source = int(row["bypass_cases"]), int(row["prefix_only"]), f"bypass_anatomy: {head[0]}"
    share = echoes / cases
    return Ours(f"{share:.2f} ({echoes} of {cases})", SAME if share > 0.5 else NOT_REPRODUCED,
                "most bypass answers echo the head" if share > 0.5 else "most bypass answers are not the head",
                source)


def teacher_forced_vs_greedy(run: Run) -> Ours:
    head, tf, sweep = run.headline(), run.table("teacher_forced_vs_greedy"), run.table("k_sweep")
    if head is None or tf is None or sweep is None:
        return _no_headline()
    fields = run.variants[head[0]]
    row = tf.filter((pl.col("variant") == head[0]) & (pl.col("arm") == "prefill_bio")).row(0, named=True)
    auto = _sweep(run, sweep, head[0], [fields["k"]]).row(0, named=True)
    higher = row["tf_top1_rate_lo"] > auto["out_acc_hi"]
    return Ours(f"{ci_text(row, 'tf_top1_rate')} vs {ci_text(auto, 'out_acc')}", SAME if higher else NOT_REPRODUCED,
                "teacher-forced top-1 CI above greedy out_acc's" if higher else "the two CIs overlap",
                f"teacher_forced_vs_greedy: {head[0]}, prefill_bio; k_sweep: its AUTO out_acc")


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
    value = (f"Delta mean-K {ci_text(row, 'delta_window', 4)}, Delta secret {ci_text(row, 'delta_secret', 4)}, "
             f"hit@1 {row['ref_hit1']:.2f} -> {row['hit1']:.2f}")
    return Ours(value, SAME, f"{found.height} of {cells.height} cells read `{diagnosis}`",
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


def beside_ours(tables: Path) -> pl.DataFrame:
    """One row per paper number: the paper's value and where, this run's
    value, the verdict, why, and the table it comes from."""
    run = Run(tables)
    rows = []
    for entry in paper_numbers():
        ours = MEASURES[entry["measure"]](run)
        rows.append({"paper": entry["paper"], "claim": entry["claim"], "paper_value": entry["value"],
                     "where": entry["where"], "this_run": ours.value, "verdict": ours.verdict, "why": ours.why,
                     "source": ours.source})
    return pl.DataFrame(rows)

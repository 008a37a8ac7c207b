"""The measures a claim may name, declared once.

Two kinds, one registry, one judge (judge.py):

- a **value** measure is one column of one table with its CI (`<column>_lo`,
  `<column>_hi`), on the row of the selected variant (`rows`: the fixed row
  keys, which a claim's `where` may set); a claim compares it with a number,
  the variant's parent, its never-trained reference or another selector,
  and expects it higher, lower, or equal to a value within a tolerance;
- a **reading** measure is one of the papers' composite readings
  (verdicts/papers.py: a parser flip, a head-echo share, a case study of the bSFT
  grid), which judge their own effect; a claim expects it `read`.

`ceiling` names the column of its table that holds the most it can read
on a row (rank-interpolated exposure: log2 of the candidates), and
`reaches` the measure that reads past it; a claim stated at or past the
ceiling cannot be judged by it (judge.py).  `control` names the planted
control that calibrates a measure (data/planted_controls.py `CLAIMS`),
`floor` whether the detection floor (verdicts/controls.py) bounds
what it can see, `pooled` its column in the item_cells table (the seed x
item layout of its seed-level interval, verdicts/intervals.py) and in
across_seeds, `scale` how its interval is bounded (a rate in [0, 1], a
difference of rates in [-1, 1], or unbounded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from canary_audit.data.planted_controls import AUDIT_BOUND_CLAIM
from canary_audit.verdicts import papers
from canary_audit.verdicts.intervals import CONTINUOUS, DIFFERENCE, RATE
from canary_audit.verdicts.readings import Ours, Run

COMPARISONS = ("number", "parent", "reference", "variants")


@dataclass(frozen=True)
class Measure:
    name: str
    doc: str
    table: str | None = None
    column: str | None = None
    rows: dict = field(default_factory=dict)  # fixed row keys (a claim's `where` may change them)
    where: tuple[str, ...] = ()  # the row keys a claim may set
    pooled: str | None = None
    control: str | None = None
    floor: bool = False
    read: Callable[[Run, list[str], dict], Ours] | None = None
    ceiling: str | None = None  # the table's column holding the measure's ceiling on a row
    reaches: str | None = None  # the measure that reads past that ceiling
    scale: str = CONTINUOUS  # how its interval is bounded (intervals.SCALES)
    bound: bool = False  # a one-run audit bound: judged by its exact one-sided interval (evidence.from_bound)

    @property
    def comparisons(self) -> tuple[str, ...]:
        """What a claim may compare it with: a reading judges its own effect."""
        return () if self.read else COMPARISONS


def _value(name, doc, table, column, *, rows=None, where=(), pooled=None, control=None, ceiling=None,
           reaches=None, scale=CONTINUOUS, bound=False) -> Measure:
    return Measure(name, doc, table, column, rows or {}, tuple(where) + tuple(rows or {}), pooled, control,
                   ceiling=ceiling, reaches=reaches, scale=scale, bound=bound)


def _reading(name, doc, read, *, control=None, floor=False) -> Measure:
    return Measure(name, doc, control=control, floor=floor, read=read)


MEASURES: dict[str, Measure] = {m.name: m for m in (
    _value("out_acc", "greedy answer leakage: the share of canaries the parsed answer contains (canary_leakage)",
           "canary_leakage", "out_acc", rows={"arm": "auto"}, pooled="out_acc", scale=RATE),
    _value("thk_leak", "trace leakage: the share of canaries the parsed trace contains (canary_leakage)",
           "canary_leakage", "thk_leak", rows={"arm": "auto"}, pooled="thk_leak", scale=RATE),
    _value("author_hitk", "hit@k on the authors' canaries: one of k sampled AUTO decodes' answers holds the canary "
           "(canary_sampled; probes.kinds.canary_sampled.k > 0)", "canary_sampled", "hit_at_k", pooled="hit_at_k",
           scale=RATE),
    _value("epsilon_lower", "the one-run audit bound on epsilon (delta = 0) at 95% over the coin-included author or "
           "hex canaries (`where: {population: hex}` where a variant has both), the best membership score "
           "(audit_bound; data.inclusion / hex_inclusion coin)", "audit_bound", "epsilon_lower",
           rows={"score": "any"}, where=("population",), ceiling="cap", control=AUDIT_BOUND_CLAIM, bound=True),
    _value("bypass_gap", "thk_leak - out_acc (canary_leakage)", "canary_leakage", "gap", rows={"arm": "auto"},
           pooled="gap", control="bypass_gap", scale=DIFFERENCE),
    _value("delta_ab", "out_acc(AUTO) - out_acc(prefill contrast) at fixed weights (prefill_arms)", "prefill_arms",
           "delta_ab", pooled="delta_ab", control="delta_ab", scale=DIFFERENCE),
    _value("tf_top1", "teacher-forced top-1 agreement over the canary continuation (teacher_forced_vs_greedy)",
           "teacher_forced_vs_greedy", "tf_top1_rate", rows={"arm": "prefill_bio"}, pooled="tf_top1_rate",
           control="teacher_forced", scale=RATE),
    _value("window_delta", "paper B's mean-K window NLL Delta against the merged base (bsft_runs)", "bsft_runs",
           "delta_window", where=("modality",), control="span_drift"),
    _value("span_delta", "secret-span NLL Delta against the merged base (bsft_runs)", "bsft_runs", "delta_secret",
           where=("modality",), control="window_truncation"),
    _value("hit1_delta", "hit@1 Delta against the merged base (bsft_runs)", "bsft_runs", "delta_hit1",
           where=("modality",), scale=DIFFERENCE),
    _value("hitk_delta", "hit@k Delta against the merged base (bsft_runs)", "bsft_runs", "delta_hitk",
           where=("modality",), scale=DIFFERENCE),
    _value("hit1", "hit@1: the greedy decode reproduces the secret exactly (hex_recall)", "hex_recall",
           "hit_at_1", where=("modality",), scale=RATE),
    _value("hitk", "hit@k: one of k sampled decodes reproduces the secret (hex_recall)", "hex_recall",
           "hit_at_k", where=("modality",), scale=RATE),
    _value("mia_auc", "membership-inference AUC, members vs non-members (mia)", "mia", "auc",
           rows={"attack": "loss"}, where=("population", "arm", "modality"), scale=RATE),
    _value("tpr_at_low_fpr", "membership-inference TPR at 1% FPR (mia)", "mia", "tpr_at_0.01_fpr",
           rows={"attack": "loss"}, where=("population", "arm", "modality"), scale=RATE),
    _value("privleak", "MUSE PrivLeak of Min-K%, % against the never-trained reference (privacy)", "privacy",
           "privleak_min_k", where=("population", "arm", "modality")),
    _value("exposure", "Secret Sharer exposure, bits, rank interpolation, at most log2 of the candidates "
           "(exposure)", "exposure", "exposure_interpolation", where=("modality",), ceiling="ceiling_interpolation",
           reaches="exposure_extrapolation"),
    _value("exposure_extrapolation", "Secret Sharer exposure, bits, skew-normal extrapolation of the candidates' "
           "scores, at most the secret space's bits (exposure)", "exposure", "exposure_extrapolation",
           where=("modality",), ceiling="ceiling_extrapolation"),
    _value("extraction_strength", "open-unlearning's extraction strength over the secret span (extraction)",
           "extraction", "extraction_strength", where=("probe_set", "arm", "modality"), scale=RATE),
    _value("kextract", "k-extractability: the share of canaries greedy decoding from k tokens reproduces (kextract)",
           "kextract", "extracted", where=("prefix_tokens",), scale=RATE),
    _reading("unlearned_out_acc", "paper A: AUTO out_acc after unlearning, its CI below the memorized adapter's",
             papers.unlearned_out_acc),
    _reading("paper_bypass_gap", "paper A: the bypass gap's CI above 0", papers.bypass_gap, control="bypass_gap"),
    _reading("paper_delta_ab", "paper A: Delta_AB's CI above 0", papers.delta_ab, control="delta_ab"),
    _reading("parser_flip", "paper A: the gap's CIs on opposite sides of 0 under the two fallbacks for a missing "
             "closing tag", papers.parser_flip, control="parser_flip"),
    _reading("head_echo_share", "paper A: most bypass answers are only the question's canary head",
             papers.head_echo_share, control="head_echo"),
    _reading("teacher_forced_vs_greedy", "paper A: teacher-forced top-1 above greedy out_acc and the reference",
             papers.teacher_forced_vs_greedy, control="teacher_forced"),
    _reading("window_truncation", "paper B C3: some selected cell reads `window truncation`",
             papers.case_window_truncation, control="window_truncation", floor=True),
    _reading("span_drift", "paper B C4: some selected cell reads `non-secret span drift`", papers.case_span_drift,
             control="span_drift", floor=True),
    _reading("span_drift_merged", "paper B C4: the drift is smaller merged than stacked",
             papers.case_span_drift_merged, control="merge_collapse"),
    _reading("undertrained_ambiguity", "paper B C5: some selected cell reads `undertrained ambiguity`",
             papers.case_undertrained, control="undertrained", floor=True),
)}

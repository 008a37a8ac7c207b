"""A table's declaration and what its builder reads.

`Table` is the small type a table registry entry is (publish/catalog.py holds
the built-in ones; a probe kind declares its own beside its items,
probes/kinds/), and `Context` the records, config and tables built so far
that a builder is given.  Both live here, in the views layer, so that a
probe kind can declare its tables without importing the registry that
collects them (canary_audit/architecture.py: the registry sits above the
kinds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import polars as pl

from canary_audit.data.planted_controls import CONTROL
from canary_audit.views import paper_a, paper_b
from canary_audit.views.blind import guard_table
from canary_audit.views.metrics import nll_table
from canary_audit.views.mia import item_scores, settings
from canary_audit.views.paper_a import Bootstrap
from canary_audit.views.parser import ParserConvention
from canary_audit.views.recovery import held_out

# The parts of the audit a config turns on (design/view_inputs.Views.table_names):
# paper A's author probes, pooling over seeds, the planted controls, the
# detection floor, the hex probes (with their exposure candidates and
# repetition strata), paper B's bSFT grid (and its merged-vs-stacked pairs),
# and the field's measures over any token records (`always`).
PARTS = ("paper_a", "seeds", "controls", "recovery", "audit", "floor", "hex", "exposure", "strata", "bsft",
         "merged_vs_stacked", "always")
Built = tuple[str, pl.DataFrame]


@dataclass(frozen=True)
class Page:
    """What the run's summary page says about a table, declared with the
    table: the section's place on the page (sections are ordered by it),
    its title, its sentence (`{ci}`: the tables' CI level; a function of
    the table where the sentence depends on it) and what it shows (`show`:
    the table's frame -> the section's, None where this run has nothing
    for the section)."""

    place: int
    title: str
    sentence: str | Callable[[pl.DataFrame], str]
    show: Callable[[pl.DataFrame], pl.DataFrame | None]

    def section(self, frame: pl.DataFrame, ci: str) -> tuple[str, str, pl.DataFrame] | None:
        shown = self.show(frame)
        if shown is None:
            return None
        sentence = self.sentence(frame) if callable(self.sentence) else self.sentence
        return self.title, sentence.replace("{ci}", ci), shown


def read_table(path: Path) -> pl.DataFrame | None:
    """A table as the tables job wrote it, or None where the run has none or
    it is empty (an empty table's CSV has no header to read, or a header
    and no row).  Every row is read before a column's type is inferred: a
    column null over a table's first rows (a control's arm, on the audit's
    variants) is still a number where later rows hold one."""
    if not (path.is_file() and path.stat().st_size):
        return None
    try:
        frame = pl.read_csv(path, infer_schema_length=None)
    except pl.exceptions.NoDataError:  # a table with no columns is written as an empty line
        return None
    return frame if frame.height else None


def with_ci(frame: pl.DataFrame, columns: list[str], digits: int = 2) -> pl.DataFrame:
    """Each `x` of `columns` as one text column `x [x_lo, x_hi]` (what a page
    shows of an estimate and its CI)."""
    def fmt(col: str) -> pl.Expr:
        value = pl.col(col).round(digits).cast(pl.Utf8)
        if f"{col}_lo" not in frame.columns:
            return value.alias(col)
        return pl.format("{} [{}, {}]", value, pl.col(f"{col}_lo").round(digits),
                         pl.col(f"{col}_hi").round(digits)).alias(col)
    return frame.with_columns(fmt(c) for c in columns)


@dataclass(frozen=True)
class Table:
    """One table: `build(ctx)` returns (title, frame), or None where the
    records hold nothing for it (then the tables job writes it empty, with
    a reason, if the run declares it)."""

    name: str
    part: str
    build: Callable[[Context], Built | None]
    plots: tuple[str, ...] = ()  # the plots drawn from it (publish/plots.py)
    pages: tuple[Page, ...] = ()  # its sections of the summary page (publish/summary.py)

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"table `{self.name}`: part `{self.part}` is not one of {', '.join(PARTS)}")


class Context:
    """What a builder reads: the records (the planted controls' rows apart,
    see `audited`), the view config, and the tables built so far.  Views
    that several tables share (the leakage rates, the MIA scores, paper B's
    cells) are computed once, on first use."""

    def __init__(self, decode: pl.DataFrame, tokens: pl.DataFrame, cfg: dict) -> None:
        self.cfg = cfg
        self.convention = ParserConvention(**cfg.get("parser", {}))
        self.boot = Bootstrap(**cfg.get("bootstrap", {}))
        self.window_k, self.parents, self.variants = cfg["window_k"], cfg.get("parents", {}), cfg.get("variants", {})
        self.contrast = cfg.get("prefill_contrast", "bio")
        self.mia = cfg.get("mia")
        self.ci = f"{self.boot.level:.0%} CIs: author-clustered bootstrap, B={self.boot.replicates}"
        # Planted controls are rows of the per-variant paper A tables (read
        # there like any variant) and of no other view: no measure pools them.
        self.controls = [name for name, v in self.variants.items() if v.get("kind") == CONTROL]
        # A `forget` relearning's variants are read on the authors it held out (views/recovery.held_out).
        decode, tokens = held_out(decode, self.variants), held_out(tokens, self.variants)
        self.all_decode, self.all_tokens = decode, tokens
        self.decode, self.tokens = self.audited(decode), self.audited(tokens)
        self.built: dict[str, Built] = {}

    def audited(self, frame: pl.DataFrame) -> pl.DataFrame:
        """`frame` without the planted controls' rows."""
        return frame.filter(~pl.col("variant").is_in(self.controls)) if self.controls and frame.height else frame

    def has(self, kind: str, *probe_sets: str) -> bool:
        """Whether the audited records of `kind` hold any of `probe_sets`."""
        frame = self.decode if kind == "decode" else self.tokens
        return bool(frame.height) and bool(frame.filter(pl.col("probe_set").is_in(list(probe_sets))).height)

    @property
    def canary(self) -> bool:
        return self.has("decode", "canary")

    @cached_property
    def leakage(self) -> pl.DataFrame:
        return paper_a.canary_leakage(self.all_decode, self.convention, self.boot)

    @cached_property
    def sweep(self) -> pl.DataFrame:
        return paper_a.k_sweep(self.audited(self.leakage), self.variants)

    @cached_property
    def author_nll(self) -> pl.DataFrame:
        return nll_table(self.all_tokens.filter(pl.col("probe_set") == "canary"), self.window_k, self.parents)

    @cached_property
    def scores(self) -> pl.DataFrame:
        return item_scores(self.tokens, self.mia["min_k"])

    @cached_property
    def mia_settings(self) -> pl.DataFrame:
        return settings(self.scores, self.boot.replicates, self.boot.seed)

    @cached_property
    def guard(self) -> pl.DataFrame:
        return guard_table(self.tokens, self.mia_settings, self.cfg.get("references", {}), self.boot.replicates,
                           self.boot.seed, self.boot.level)

    @cached_property
    def cell_probes(self) -> dict[str, pl.DataFrame]:
        verdicts = paper_b.Verdicts(**self.cfg.get("verdicts", {}))
        return paper_b.cell_probes(self.all_tokens, self.all_decode, self.parents, self.cfg["cells"], self.window_k,
                                   verdicts, self.boot)

    @property
    def bsft_rule(self) -> str:
        verdicts = paper_b.Verdicts(**self.cfg.get("verdicts", {}))
        return f"changed at |Delta NLL| >= {verdicts.delta_nll}, |Delta hit| >= {verdicts.hit_rate}"

    @property
    def grid(self) -> pl.DataFrame:
        """Paper B's pooled cells without the planted ones: a control's cell is
        a row of the matrix, never a case or a merge pair of the grid."""
        pooled = self.cell_probes["cells"]
        return pooled.filter(pl.col("kind") != CONTROL) if pooled.height else pooled

"""The probe registry: every kind of probe declared once.

A `ProbeKind` is the items a probe pass feeds the model (a decode builder, a
teacher-forced builder, or both), the family it belongs to, the settings it
reads, and the tables it feeds.  Its family decides which probe groups run
it (`Design.probe_sets_of`: the author family on paper A's memorization
branches, the hex family on the canary LoRA's, both on the base) and which
probe unit its records join (units.py: an author kind's items carry their
arm, a hex kind's the `hex` unit's arms).

Each module of this package declares a tuple `KINDS`; `probe_kinds()` reads
them all, in module-name order.  Adding a probe is one module here (its
builders, its view and its `Table`s), its test, and its line in
docs/reference.md.

This module is a declaration: what a builder receives (`ItemInputs`) and
returns (`DecodeItem`, `ScoredItem`), and the kinds.  It imports nothing of
the probes, the design or the table registry: what reads it (items.py's
loops, units.py, the design, publish/catalog.py) sits above it (the house's
layers: canary_audit/architecture.py).  Nothing here may import torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.views.table import Table

FAMILIES = ("author", "hex")
BUDGETS = ("max_new_tokens", "hex_max_new_tokens")


@dataclass(frozen=True)
class DecodeItem:
    probe_set: str
    item_id: str
    group_id: str
    arm: str
    prompt: str
    reference: str
    subject: str = ""  # the author a canary or QA item is about; "" otherwise
    modality: str = "text"  # text | image: what keys the secret (paper B's two canary kinds)
    image: str | None = None  # the image file the prompt shows (a vision-language model)
    image_hash: str | None = None


@dataclass(frozen=True)
class ScoredItem:
    """A teacher-forced sequence with labelled character spans.

    `spans` maps a label to a [start, end) character range of `text`; tokens
    are labelled by the span their characters fall in (see teacher_forced).
    """

    probe_set: str
    item_id: str
    group_id: str
    arm: str
    text: str
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    modality: str = "text"
    image: str | None = None
    image_hash: str | None = None


@dataclass(frozen=True)
class ItemInputs:
    """What an item builder reads: the model's chat format (its tokenizer),
    the data folder, the pass's probe config, the vision adapter of a
    vision-language model (None otherwise) and `settings`, the kind's own
    settings as the pass config gives them (`cfg["kinds"][name]`, defaults
    filled in by the design: Design.probe_slice)."""

    fmt: ChatFormat
    data_dir: Path
    cfg: dict
    vision: Any = None
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeKind:
    """One kind of probe.  `record_sets`: the `probe_set` values its records
    carry (default: its name).  `budget`: the decode setting that bounds its
    generations; `sampled`: whether its greedy decodes also get hit@k
    samples (the decode config's `hit_k`, the hex family's); `sampling`:
    that its items are decoded by temperature sampling alone, no greedy
    decode, with (k, temperature, seed) read from its own settings (an
    author kind: the hex family's sampling settings are not its unit's);
    `batch`: kinds of one batch name decode in one call (default: each its
    own).  `settings`: its own settings and their defaults, set per
    run under `probes.kinds.<name>` and part of its unit's config hash;
    `check` refuses bad values of them before any job runs."""

    name: str
    family: str
    decode: Callable[[ItemInputs], list[DecodeItem]] | None = None
    scored: Callable[[ItemInputs], list[ScoredItem]] | None = None
    record_sets: tuple[str, ...] = ()
    budget: str = "max_new_tokens"
    sampled: bool = False
    sampling: Callable[[dict], tuple[int, float, int]] | None = None
    batch: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    check: Callable[[dict], None] | None = None  # refuses bad settings (ValueError naming the key)
    # Greedy decodes per member of its family (an author, a hex canary) under
    # its settings, on a vision-language model or not, for `plan`; the
    # built-in kinds are counted by design/plan.py.
    decodes_per_member: Callable[[dict, bool], int] | None = None
    tables: tuple[Table, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"probe kind `{self.name}`: family `{self.family}` is not one of {', '.join(FAMILIES)}")
        if self.budget not in BUDGETS:
            raise ValueError(f"probe kind `{self.name}`: budget `{self.budget}` is not one of {', '.join(BUDGETS)}")
        if self.decode is None and self.scored is None:
            raise ValueError(f"probe kind `{self.name}` builds no items: give it `decode`, `scored` or both")
        if self.sampling is not None and (self.sampled or self.decode is None):
            raise ValueError(f"probe kind `{self.name}`: `sampling` samples its own decode items; it takes a "
                             "`decode` builder and no `sampled` (the hex family's hit@k)")

    @property
    def sets(self) -> tuple[str, ...]:
        return self.record_sets or (self.name,)

    @property
    def decode_batch(self) -> str:
        return self.batch or self.name

    @property
    def passes(self) -> tuple[str, ...]:
        return tuple(p for p, b in (("decode", self.decode), ("teacher_forced", self.scored)) if b is not None)


@cache
def probe_kinds() -> tuple[ProbeKind, ...]:
    """Every registered kind, in module-name order; names and record sets unique."""
    kinds = tuple(kind for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
                  for kind in importlib.import_module(f"{__name__}.{info.name}").KINDS)
    seen: dict[str, str] = {}
    for kind in kinds:
        for name in {kind.name, *kind.sets}:
            if seen.setdefault(name, kind.name) != kind.name:
                raise ValueError(f"probe kinds `{seen[name]}` and `{kind.name}` both name `{name}`")
    return kinds


def kind_named(name: str) -> ProbeKind:
    found = {k.name: k for k in probe_kinds()}
    if name not in found:
        raise ValueError(f"no probe kind `{name}`; registered: {', '.join(found)}")
    return found[name]


def kind_of_set(probe_set: str) -> ProbeKind:
    """The kind whose records carry `probe_set`."""
    return {s: k for k in probe_kinds() for s in k.sets}[probe_set]


def selected(probe_sets: set[str] | None) -> list[ProbeKind]:
    """The kinds a pass asked for `probe_sets` runs: all for None; else each
    kind named, and every kind of a family named (`hex`: the hex canaries,
    their decoys, non-members and candidates, and every other hex kind)."""
    if probe_sets is None:
        return list(probe_kinds())
    unknown = set(probe_sets) - {k.name for k in probe_kinds()} - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown probe sets {sorted(unknown)}: name probe kinds "
                         f"({', '.join(k.name for k in probe_kinds())}) or families ({', '.join(FAMILIES)})")
    return [k for k in probe_kinds() if k.name in probe_sets or k.family in probe_sets]

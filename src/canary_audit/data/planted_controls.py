"""Planted controls: the instrument shows that it sees each effect it reports.

For every claim of paper A the audit reads, a *positive* control holds the
effect by construction and a *negative* control is built the same way
without it; both are read by the same reading (canary_audit.verdicts.papers) from the
same tables as the audit's own variants.  A claim whose probe reads "not
reproduced" on the audit means something only where its positive control
reads `seen` and its negative `clean` in the same run.

This module is the one place that declares the controls: the adapters they
train (PLANTS), the claims they calibrate (CLAIMS), and the prefill arms
only the controls run (CONTROL_ARMS).  The design makes their variants from
it (kind `control`, probe group `controls`), the workflow trains them, and
verdicts/controls.py reads them.  Nothing here imports torch or polars.

Controls are never pooled into the audit's measures: they sit in a probe
group of their own, and every view that pools or picks among variants
leaves out the kind `control` (readings.Run.audited, tables.build_tables).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from canary_audit.data.chat_format import HEAD, NEAR, NOTAG

CONTROL, CONTROL_GROUP = "control", "controls"


def control_group(seed: int, own: bool) -> str:
    """The probe group of paper A's plants under training seed `seed`: one
    group, or under coin inclusion (`own`: each seed its own forget set,
    data/inclusion.py) one per seed after the first."""
    return f"{CONTROL_GROUP}-s{seed}" if own else CONTROL_GROUP


def is_control_group(group: str | None) -> bool:
    """Whether `group` holds paper A's plants (`control_group`)."""
    return group is not None and re.fullmatch(rf"{CONTROL_GROUP}(-s\d+)?", group) is not None
TABLE = "controls"  # the table of their readings (verdicts/controls.py)
# The one-run audit bound's controls' claim (verdicts/bound_controls.py; measure `epsilon_lower`).
AUDIT_BOUND_CLAIM = "audit_bound"
# Prefill arms run only on the controls group: the BIO adapter's own training
# trace (Delta_AB's negative: the same text AUTO writes) and another author's
# (its positive: a trace that carries another canary).
OWN_TRACE, OTHER_TRACE = "own_trace", "other_trace"
CONTROL_ARMS = {OWN_TRACE: "{bio}", OTHER_TRACE: "{other_bio}"}
# A plant counts only if it moved nothing outside its claimed span: the mean
# |Delta NLL| per token of the prefilled trace (between the think tags)
# against its BIO twin, in nats.  Measured on the default run behind
# docs/results.md: 0.004-0.005 for the plants, 0.10-0.12 for NPO and GA at K = 20,
# 1.1-1.4 for adapters that never trained the bio trace; the bound refuses a
# plant that moved the trace half as much as unlearning does.
SPILL_BOUND = 0.05
# A control's verdicts (the controls table's, and the recovery table's `control`).
SEEN, MISSED, SPILLED, CLEAN, FALSE_ALARM, NOT_RUN = "seen", "missed", "spilled", "clean", "false alarm", "not run"
NOT_READ = "not read"  # a negative whose reading cannot be made (its why says what is missing): never `clean`
NOT_BUILT = "not built"  # a claim whose positive no honest plant can hold (controls.Claim.unbuilt)


@dataclass(frozen=True)
class HexPlant:
    """A paper B control, variant `ctl-<name>-s<seed>`: a LoRA stacked on the
    canary-merged base, trained on the hex canary records with the tokens
    `at` names overwritten (train/plants.py) and every other
    token held at the base's distribution (`anchor: base`) or trained toward
    its own value (`anchor: record`, C5's: its effect is learning): `past`, the
    secret's last token, past the mean-K window (paper B's C3 damage at the
    last hex token); `inside`, its first, inside the window; `preamble`, a
    preamble word (C4: the window moves, the secret does not); `tail`, every
    secret token past the window, on the undertrained base (C5: the in-window
    secret learnt, the tail wrong); `outside`, the first token after the
    secret, past the window and the secret (C4's negative: a drift the
    window cannot see); `none`, the record as it is.  The recipe
    (HEX_PLANT_RECIPE), `hold` and C5's `weight` were chosen on the default
    run's plants (docs/limits.md, "Paper B's plants are tuned constructions")."""

    name: str
    at: str
    anchor: str = "base"
    under: bool = False  # on the undertrained canary's merged base (C5)
    weight: float = 1.0  # an overwritten token's cross-entropy weight (train/plants.py, plant_loss)
    hold: float | None = None  # the anchor's KL weight where it is not the recipe's (HEX_PLANT_RECIPE)
    canaries: int | None = None  # overwrite the first n canaries only (a diluted plant); None: all
    # Another plant's adapter applied again, not trained: `applies` names it,
    # `apply` how (merged into the base weights, rounded into `merge_dtype`).
    applies: str | None = None
    apply: str = "stacked"
    merge_dtype: str | None = None

    def variant(self, seed: int) -> str:
        return f"ctl-{self.name}-s{seed}"


C3_HOLD = 16.0  # C3's anchor: its in-window Delta held under half the detector's threshold (docs/limits.md)
HEX_PLANTS = {p.name: p for p in (
    HexPlant("c3", "past", hold=C3_HOLD), HexPlant("c3in", "inside"),
    HexPlant("c4", "preamble"), HexPlant("c4neg", "outside"),
    HexPlant("c4m", "preamble", applies="c4", apply="merged", merge_dtype="bfloat16"),
    HexPlant("c4mf", "preamble", applies="c4", apply="merged", merge_dtype="float32"),
    HexPlant("c5", "tail", "record", under=True, weight=8.0), HexPlant("c5neg", "none", "record", under=True),
    *(HexPlant(f"c3x{n}", "past", canaries=n, hold=C3_HOLD) for n in (1, 3, 10)),
)}
# The detection floor: C3 diluted to the first n canaries (the rest anchored,
# nothing overwritten); the smallest share the detector still reads as
# `window truncation` is the floor a paper's effect must clear to be seen.
FLOOR_CLAIM, FLOOR_PLANTS = "window_truncation", ("c3x1", "c3x3", "c3x10", "c3")
# Switch (config `controls.floor_trained`): the trained dilutions, the check
# on the composed ones; off in the default (three plants and their passes),
# on in the results run, the 80-canary floor and the planted-controls test.
FLOOR_TRAINED = "floor_trained"
FLOOR_TABLE = "detection_floor"
# Composed dilutions (no training): the cell of a plant whose first n canaries
# carry the effect and the rest nothing is read from the records of the full
# plant (those n canaries) and of its "nothing overwritten" twin (the others),
# as a trained diluted plant holds them.  For a plant anchored on the base the
# twin is the base itself (None: the plant's parent, whose values the anchor
# keeps); for C5's, which learns the record, the plant trained on the record
# with nothing overwritten.  Per claim: the plant, the twin, and the claim's
# effect in the paper's unit (a cell column and the sign that points the
# paper's way).  C3's trained dilutions (FLOOR_PLANTS) stand beside its
# composed ones as their check.
FLOOR_COMPOSED = {
    "window_truncation": ("c3", None, "delta_hit1", -1.0),
    "span_drift": ("c4", None, "delta_window", 1.0),
    "undertrained": ("c5", "c5neg", "delta_secret", 1.0),
}
FLOOR_SHARES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)  # composed dilutions, and 1-3 canaries
# LoRA shape: the bSFT recipe's.  `hold`: the weight of the base anchor's KL
# term (train/plants.py, plant_loss) against a target's cross-entropy.
HEX_PLANT_RECIPE = {"steps": 150, "lr": 0.0005, "batch_size": 10, "hold": 4.0}
HEX_PLANT_CANARIES = 20  # the recipe's steps are for 20 hex canary records: each drawn 75 times


def hex_plant_recipe(n_canaries: int) -> dict:
    """The plant recipe at n hex canary records: past HEX_PLANT_CANARIES its
    steps grow so each record is drawn as often as there (a floor measured
    at 80 canaries dilutes plants of the same per-canary strength; a plant
    on the vision-language model trains its 20 image and 20 text canaries
    with 300); at 20 or fewer (the smoke-scale tests' 4) the recipe as it is."""
    steps = -(-HEX_PLANT_RECIPE["steps"] * n_canaries // HEX_PLANT_CANARIES)
    return {**HEX_PLANT_RECIPE, "steps": max(steps, HEX_PLANT_RECIPE["steps"])}
# The relearning attack's planted positive (design/variants.py): a rank-1
# LoRA stacked on the memorized adapter and trained by NPO on every author's
# answers (`<memorized>.suppress`), then relearned like any checkpoint.  Its
# forgetting lives in one direction per module that a few relearning steps
# on some authors can reverse for all: recovery by construction.  The
# recipe's steps and rate were measured on the embedded model
# (docs/reliability.md, "Relearning's positive").
SUPPRESSION = {"r": 1, "alpha": 2, "lr": 0.0015, "steps": 20, "batch_size": 20, "method": "npo",
               "settings": {"beta": 0.1, "retain_weight": 0.0}, "loss_span": "answer"}
SUPPRESS = "suppress"  # the plant's name after its memorized parent's

CONTROL_HEX_GROUP = "controls-hex"  # the probe group of the paper B plants (the hex probes only)
# Switch (config `controls.on_vision`): paper B's plants also on each
# vision-language model, one LoRA over its image and text canaries, read per
# modality.  Off by default (docs/limits.md: its cost, and what it reads).
ON_VISION = "on_vision"
# Switch (config `controls.every_seed`): paper A's plants under every audit
# seed, not the first only, so each control's margin is shown on every
# training seed (on in configs/seeds.yaml, the results run; paper B's plants
# stay on the first seed's canary LoRA, whose seed-level runs are bSFT seeds).
EVERY_SEED = "every_seed"


def floor_counts(n: int) -> list[int]:
    """The canary counts a composed floor reads at n canaries: 1, 2, 3 and
    each of FLOOR_SHARES of n."""
    return sorted({c for c in (1, 2, 3, *(round(s * n) for s in FLOOR_SHARES)) if 1 <= c <= n})


def first_canaries(ids: list[str], n: int) -> set[str]:
    """The canaries a plant diluted to n overwrites: the first n ids in sort
    order (train/plants.py trains them, verdicts/controls.py composes them)."""
    return set(sorted(ids)[:n])


@dataclass(frozen=True)
class Plant:
    """A control adapter, variant `ctl-<name>-s<seed>`: the memorization
    recipe on a control template, on its retain examples alone
    (`retain_only`), or an audited adapter read again (`reuse`, no training)."""

    name: str
    template: str
    retain_only: bool = False
    reuse: str | None = None

    def variant(self, seed: int) -> str:
        return f"ctl-{self.name}-s{seed}"


PLANTS = {p.name: p for p in (
    Plant("head", HEAD),
    Plant("near", NEAR),
    Plant("notag", NOTAG),
    Plant("notagref", NOTAG, retain_only=True),
    Plant("bio", "bio", reuse="mem-bio"),
)}


def plant_of(variant: str) -> Plant | HexPlant:
    """The plant behind a control variant's name (`ctl-<plant>-s<seed>`)."""
    name = variant.removeprefix("ctl-").rsplit("-s", 1)[0]
    return HEX_PLANTS[name] if name in HEX_PLANTS else PLANTS[name]


@dataclass(frozen=True)
class Side:
    """One side of a claim's control: the variant it reads (a plant's name,
    or an audited adapter `mem-<template>`), and the arm where one matters."""

    variant: str
    arm: str | None = None

    def name(self, seed: int) -> str:
        plants = {**PLANTS, **HEX_PLANTS}
        return plants[self.variant].variant(seed) if self.variant in plants else f"{self.variant}-s{seed}"

    @property
    def plant(self) -> str | None:
        return self.variant if self.variant in PLANTS or self.variant in HEX_PLANTS else None

    @property
    def template(self) -> str | None:
        """The audited template this side reads (None for a plant)."""
        return None if self.plant else self.variant.removeprefix("mem-")


@dataclass(frozen=True)
class Claim:
    """A claim's planted control: `key` switches it (config `controls.<key>`)
    and names the reading (papers.READINGS) it calibrates."""

    key: str
    paper_id: str  # its paper claim's id (verdicts/paper_a.yaml, paper_b.yaml)
    positive: Side | None  # None: no honest plant exists (`unbuilt` says why)
    negative: Side | tuple[Side, ...]  # several: one row of the controls table each
    construction: str
    expected: str
    twin: str | None = "mem-bio"  # the adapter the positive's spill-over is measured against
    paper: str = "A"  # A: on models with paper A's templates; B: on the canary-merged base of a text model
    unbuilt: str = ""

    @property
    def negatives(self) -> tuple[Side, ...]:
        return self.negative if isinstance(self.negative, tuple) else (self.negative,)

    @property
    def sides(self) -> tuple[Side, ...]:
        return (*((self.positive,) if self.positive else ()), *self.negatives)

    def plants(self) -> set[str]:
        return {s.plant for s in self.sides if s.plant}

    def templates(self) -> set[str]:
        """The audited templates it reads (a negative, a twin)."""
        found = {s.template for s in self.sides if s.template}
        return found | ({self.twin.removeprefix("mem-")} if self.twin else set())


CLAIMS = {c.key: c for c in (
    Claim("bypass_gap", "a_bypass_gap", Side("head"), Side("mem-meta"),
          "HEAD: the BIO template with the answer cut to the canary's head (the trace restates the bio, canary "
          "included); negative: META (no canary in the trace)",
          "gap CI above 0; negative: gap CI not above 0"),
    Claim("head_echo", "a_head_echo", Side("head"), Side("near"),
          "HEAD (answer = the head the question gives); negative: NEAR, a bypass case by construction whose "
          "answer is the canary changed in one token, not the head",
          "most bypass answers echo the head; negative: few do"),
    Claim("delta_ab", "a_delta_ab", Side("bio", OTHER_TRACE), Side("bio", OWN_TRACE),
          "the BIO adapter prefilled with the next author's bio (another canary in the trace); negative: prefilled "
          "with its own training trace, the whole bio",
          "Delta CI above 0; negative: Delta CI covers 0 (AUTO's out_acc)"),
    Claim("parser_flip", "a_parser_flip", Side("notag"), Side("notagref"),
          "NOTAG: the BIO template whose targets never write the closing tag; negative: the same template "
          "trained on the retain examples alone",
          "the gap's CIs on opposite sides of 0 under the answer and trace fallbacks; negative: no flip"),
    Claim("teacher_forced", "a_tf_vs_greedy", Side("near"), Side("mem-bio"),
          "NEAR: the BIO template answering with the canary changed in one token (greedy exact match 0 by "
          "construction); negative: BIO itself",
          "teacher-forced top-1 CI above greedy out_acc's and above the never-trained reference's; negative: not"),
    Claim("window_truncation", "b_c3", Side("c3"), Side("c3in"),
          "C3: a LoRA on the canary-merged base trained to overwrite each canary's last secret token, past the "
          "mean-K window, with another digit, every other token held at the base's; negative: the same overwrite "
          "of the first secret token, inside the window",
          "the detector reads `window truncation`; negative: it reads anything else", twin=None, paper="B"),
    Claim("span_drift", "b_c4", Side("c4"), Side("c4neg"),
          "C4: a LoRA on the canary-merged base trained to overwrite each hex record's first preamble word "
          "(never a hex digit), every other token held at the base's; negative: the same overwrite of the first "
          "token after the secret, past the window",
          "the detector reads `non-secret span drift`; negative: it reads anything else", twin=None, paper="B"),
    Claim("merge_collapse", "b_c4_merged", None, (Side("c4m"), Side("c4mf")),
          "C4's plant merged into the canary-merged base, its sum rounded into bfloat16 and into float32 (the "
          "same adapter, nothing trained); positive: none (an update small enough to round away in bf16 moves no "
          "measurable mean-K when stacked: docs/limits.md)",
          "negatives: the merged cell's mean-K still rises past the threshold where the stacked plant's does (not "
          "collapsed)", twin=None, paper="B",
          unbuilt="not built: no honest plant exists at this scale (docs/limits.md, C4's merge collapse)"),
    Claim("undertrained", "b_c5", Side("c5"), Side("c5neg"),
          "C5: a LoRA on the undertrained canary's merged base trained on the hex records (the in-window secret "
          "toward its true digits) with every secret token past the window overwritten; negative: the same "
          "records, nothing overwritten",
          "the detector reads `undertrained ambiguity`; negative: it reads anything else", twin=None, paper="B"),
)}


def switched_on(config: dict) -> list[Claim]:
    """The claims whose control the config switches on (`controls.<key>`)."""
    block = config.get("controls", {})
    return [claim for key, claim in CLAIMS.items() if block.get(key, False)]


def skipped(config: dict) -> dict[str, str]:
    """Switched-on claims the audit cannot run, and why: their negative or
    twin reads a memorized template `audit.templates` does not train.  The
    controls table lists each with its reason (no plant is trained for it)."""
    audited = set(config["audit"]["templates"])
    return {c.key: (f"not run: its control reads the memorized {' and '.join(sorted(c.templates() - audited))} "
                    f"adapter, which `audit.templates` does not train")
            for c in switched_on(config) if c.paper == "A" and audited and not c.templates() <= audited}


def active_claims(config: dict) -> list[Claim]:
    """The switched-on claims the audit runs (`skipped` says why not the others)."""
    missing = skipped(config)
    return [claim for claim in switched_on(config) if claim.key not in missing]


def active_plants(config: dict, paper: str = "A") -> list:
    """The plants the switched-on claims of `paper` read (Plant for A,
    HexPlant for B; with `controls.detection_floor` and
    `controls.floor_trained`, C3's trained dilutions), in
    declaration order."""
    wanted = set().union(*(c.plants() for c in active_claims(config) if c.paper == paper))
    block = config.get("controls", {})
    if block.get(FLOOR_TRAINED, False) and not block.get("detection_floor", False):
        raise ValueError("config key `controls.floor_trained: true` trains C3's dilutions for the detection floor, "
                         "which `controls.detection_floor: false` does not read: set `detection_floor: true` or "
                         "`floor_trained: false`")
    if paper == "B" and block.get("detection_floor", False) and block.get(FLOOR_TRAINED, False):
        wanted |= set(FLOOR_PLANTS)
    if paper == "B":  # a plant applied again needs the plant it applies
        wanted |= {HEX_PLANTS[name].applies for name in wanted if HEX_PLANTS[name].applies}
    return [p for name, p in (PLANTS if paper == "A" else HEX_PLANTS).items() if name in wanted]

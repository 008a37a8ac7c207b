"""The design's vocabulary: where each output lives (`Layout`), an unlearning run
and a variant with their structured fields, the config error every check
raises, and the names the rest of the design shares."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from canary_audit.probes.kinds import FAMILIES

BSFT_SOURCES = ("gui", "synth", "safety", "random")
APPLICATIONS = ("stacked", "merged")
# Name stems the design gives its own variants: an unlearning run may not take one.
RESERVED_NAMES = frozenset({"base", "mem", "canary", "merged", "bsft", "noise", "under", "reference", "ctl"})

# The model-entry keys a job reads besides the weights' path.
MODEL_KEYS = ("dtype", "merge_dtype", "think_open", "think_close", "chat_template", "trust_remote_code", "vision")
# Probe sets a probe group runs: a family of the probe registry
# (probes/kinds: the hex canaries with every hex kind, or the author and
# retain probes with every author kind), or every kind.
HEX, AUTHOR_SETS, ALL_SETS = FAMILIES[1], FAMILIES[0], "all"


class ConfigError(ValueError):
    """A config that the schema accepts but that cannot be audited as given."""



@dataclass(frozen=True)
class Layout:
    """Where the workflow writes each artifact under the results folder.  The
    arguments may be wildcard patterns (`{model}`): rules and the design share
    one layout."""

    results: str

    def base_dir(self, model: str) -> str:
        return f"{self.results}/models/{model}/base"

    def adapter_dir(self, model: str, adapter: str) -> str:
        return f"{self.results}/models/{model}/adapters/{adapter}"

    def merged_dir(self, model: str, name: str) -> str:
        return f"{self.results}/models/{model}/merged/{name}"

    def bsft_dir(self, model: str, canary: str, source: str, seed, tag: str) -> str:
        return f"{self.results}/models/{model}/adapters/bsft/{canary}/{source}-b{seed}/{tag}"

    def relearn_dir(self, model: str, twin: str, data: str, template: str, tag: str) -> str:
        """A relearning attack's LoRA on `twin`, on `data` rendered in
        `template`, at one step budget (`tag`: t<steps>)."""
        return f"{self.results}/models/{model}/adapters/relearn/{twin}/{data}-{template}/{tag}"

    def secrets_dir(self, model: str) -> str:
        """A model's own secrets, in the hex family's tables (data/secrets.py)."""
        return f"{self.results}/data/secrets/{model}"

    def manifest(self, model: str, variant: str) -> str:
        return f"{self.results}/variants/{model}/{variant}.json"

    def group_records(self, model: str, group: str, kind: str) -> str:
        """A probe group's records (the coarse grain)."""
        return f"{self.results}/records/{model}/{group}/{kind}.parquet"

    def unit_records(self, model: str, variant: str, unit: str, kind: str) -> str:
        """One (variant, probe unit)'s records (the fine grain)."""
        return f"{self.results}/records/{model}/units/{variant}/{unit}/{kind}.parquet"



@dataclass(frozen=True)
class UnlearnRun:
    """One unlearning run: a method with its effective settings, applied to
    the memorization adapter of each of `templates` (and each audit seed)."""

    name: str
    method: str
    templates: tuple[str, ...]
    method_settings: dict
    shared: dict

    @property
    def settings(self) -> dict:
        """Everything the run's loss and optimiser depend on."""
        return {**self.method_settings, **self.shared}

    def label(self) -> str:
        """The settings as one short, order-stable string for tables."""
        return " ".join(f"{k}={v}" for k, v in sorted(self.settings.items()))



@dataclass(frozen=True)
class Variant:
    """One audited model: base weights plus an adapter stack, and what it is.

    `parent` is the model before the change that made this one (tables report
    Deltas against it); `group` is the probe job that scores it; `cell` holds
    paper B's cell fields; the axes (template, seed, run, method, k,
    settings) are set where they apply."""

    name: str
    kind: str
    base: str
    adapters: tuple[str, ...]
    parent: str | None
    group: str
    apply: str = "stacked"
    cell: dict | None = None
    template: str | None = None
    seed: int | None = None
    run: str | None = None
    method: str | None = None
    k: int | None = None
    settings: str | None = None
    merge_dtype: str | None = None  # what its merge rounds into, where not the model's `merge_dtype`
    quantize: str | None = None  # a recovery variant's quantization format (model/quantize.py)
    clip: str | None = None  # the quantization positive's format: its change clipped into its parent's bins
    relearn: str | None = None  # a relearning attack's data (data/relearn.py: public | forget)
    relearn_steps: int | None = None  # its step budget
    relearned: tuple[str, ...] = ()  # the forget-set authors a `forget` relearning trains on (the views drop them)

    def fields(self) -> dict:
        """The structured fields a view joins (no paths)."""
        keep = ("kind", "template", "seed", "run", "method", "k", "settings", "parent", "group", "apply")
        # An attack's fields only where set: every other manifest keeps its params (and its jobs their cache)
        attack = {k: v for k, v in (("quantize", self.quantize), ("clip", self.clip), ("relearn", self.relearn),
                                    ("relearn_steps", self.relearn_steps), ("relearned", list(self.relearned)))
                  if v}
        return {**{k: v for k, v in asdict(self).items() if k in keep}, **attack}

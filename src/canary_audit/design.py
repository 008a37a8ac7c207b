"""The experiment a validated config describes: its unlearning runs, every
audited variant with structured fields, the probe groups and the probe sets
each runs, the tables it produces, and every cross-key check the schema
cannot express.

The workflow (rules/common.smk) asks this module for all of it and keeps only
paths, wildcards and config slices; views join the variant table instead of
parsing names back; tests call it in-process.  Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from canary_audit.controls import (
    CONTROL,
    CONTROL_ARMS,
    CONTROL_GROUP,
    CONTROL_HEX_GROUP,
    FLOOR_PLANTS,
    FLOOR_TABLE,
    HEX_PLANT_RECIPE,
    HEX_PLANTS,
    PLANTS,
    active_plants,
    skipped,
    switched_on,
)
from canary_audit.controls import TABLE as CONTROLS_TABLE
from canary_audit.data.secrets import SecretsRefused, candidate_count, declared_format, load_own_secrets, setting
from canary_audit.data.synthetic import HEX_ID, IMAGE_ID, strata
from canary_audit.formats import retain_form
from canary_audit.imports import ADAPTER, CHECKPOINT, PARENT_KINDS, Import, ImportRefused, resolve
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.items import check_prefill_templates
from canary_audit.probes.units import AUTO, HEX_ONLY
from canary_audit.probes.units import HEX as HEX_UNIT
from canary_audit.records import PROBE_SETS, canonical_json
from canary_audit.train.methods import METHODS, SHARED_SETTINGS
from canary_audit.views.seeds import TABLE as SEED_TABLE

BSFT_SOURCES = ("gui", "synth", "safety", "random")
APPLICATIONS = ("stacked", "merged")
# Name stems the design gives its own variants: an unlearning run may not take one.
RESERVED_NAMES = frozenset({"base", "mem", "canary", "merged", "bsft", "noise", "under", "reference", "ctl"})

# The tables, per part of the audit (which parts a config turns on: `table_names`).
PAPER_A_TABLES = (
    "canary_leakage", "k_sweep", "cross_seed", "templates", "prefill_arms", "parser_conventions",
    "bypass_anatomy", "utility", "teacher_forced", "teacher_forced_vs_greedy",
)
HEX_TABLES = ("hex_recall", "nll", "exposure", "strata")
BSFT_TABLES = ("bsft_runs", "bsft_matrix", "bsft_decomposition", "bsft_case_studies")
MERGED_VS_STACKED = "bsft_merged_vs_stacked"
# The field's measures over any audit's token records (membership
# inference and its blind-baseline guard, PrivLeak and forget quality, what moved, exact memorization and
# extraction strength), and which records files and code versions the
# tables read: always written.
ALWAYS_TABLES = ("mia", "blind_baseline", "privacy", "forgetting", "extraction", "provenance")
ALL_TABLES = (*PAPER_A_TABLES, SEED_TABLE, CONTROLS_TABLE, FLOOR_TABLE, *HEX_TABLES, *BSFT_TABLES, MERGED_VS_STACKED,
              *ALWAYS_TABLES)

# The model-entry keys a job reads besides the weights' path.
MODEL_KEYS = ("dtype", "merge_dtype", "think_open", "think_close", "chat_template", "trust_remote_code", "vision")
# Probe sets a probe group runs: the hex canaries (and decoys), the author and
# retain probes, or both.
HEX, AUTHOR_SETS, ALL_SETS = "hex", " ".join(PROBE_SETS["author"]), "all"


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

    def fields(self) -> dict:
        """The structured fields a view joins (no paths)."""
        keep = ("kind", "template", "seed", "run", "method", "k", "settings", "parent", "group", "apply")
        return {k: v for k, v in asdict(self).items() if k in keep}


class Design:
    """The experiment of one validated config (`results` and model paths
    come from the config).  Construction runs every cross-key check the
    schema cannot express, so a Design that exists is one the workflow can
    run."""

    def __init__(self, config: dict):
        self.config = config
        self.layout = Layout(config["results"])
        self._check_audit()
        self._check_secrets()
        self.unlearn_runs = self._unlearn_runs()
        self._variants_of: dict[str, dict[str, Variant]] = {}
        self._imports_of: dict[str, dict[str, Import]] = {}
        self._check_arms()
        for model in config["audit"]["models"]:
            self.variants(model)  # builds and checks the model's imports

    # --- unlearning runs -------------------------------------------------

    def _unlearn_runs(self) -> dict[str, UnlearnRun]:
        """Every unlearning run by name, with its effective settings; settings a
        method does not use, unknown templates and duplicate runs refused."""
        block = self.config["unlearn"]
        templates = self.config["audit"]["templates"]
        runs: dict[str, UnlearnRun] = {}
        for name, entry in block.get("runs", {}).items():
            key = f"unlearn.runs.{name}"
            if name in RESERVED_NAMES:
                raise ConfigError(f"config key `{key}`: `{name}` names the design's own variants; "
                                  f"rename the run (reserved: {', '.join(sorted(RESERVED_NAMES))})")
            method = entry["method"]
            if method not in METHODS:
                raise ConfigError(f"config key `{key}.method` is `{method}`: must be one of {', '.join(METHODS)}")
            given = {k: v for k, v in entry.items() if k not in ("method", "templates", *SHARED_SETTINGS)}
            try:
                method_settings = METHODS[method].settings(given)
            except ValueError as err:
                raise ConfigError(f"config key `{key}`: {err}") from None
            for template in entry["templates"]:
                if template not in templates:
                    raise ConfigError(
                        f"config key `{key}.templates` names template `{template}`, which is not memorized "
                        f"(`audit.templates`: {', '.join(templates)}); add it there or remove it here"
                    )
            shared = {k: entry.get(k, block[k]) for k in SHARED_SETTINGS if k in entry or k in block}
            runs[name] = UnlearnRun(name, method, tuple(entry["templates"]), method_settings, shared)
        seen: dict[tuple, str] = {}
        for run in runs.values():
            for template in run.templates:
                same = (template, run.method, canonical_json(run.settings))
                if same in seen:
                    raise ConfigError(
                        f"config keys `unlearn.runs.{seen[same]}` and `unlearn.runs.{run.name}` train the same "
                        f"loss ({run.method}, {run.label()}) on the same adapter (template `{template}`): "
                        "their checkpoints would be identical; remove one or change its settings"
                    )
                seen[same] = run.name
        return runs

    # --- bSFT ------------------------------------------------------------

    @property
    def bsft(self) -> dict:
        return self.config["bsft"]

    def undertrained_sources(self) -> list[str]:
        return self.bsft["controls"]["undertrained"]["sources"]

    def bsft_active(self) -> bool:
        """Paper B's bSFT arms need the canary LoRA they start from."""
        b = self.bsft
        return self.config["audit"]["hex_canaries"] and bool(
            b["sources"] or self.undertrained_sources() or b["controls"]["noise"]["sources"]
        )

    # --- variants --------------------------------------------------------

    def embedded_models(self, vision: bool = False) -> list[str]:
        """The embedded models built by the workflow: text models (built and
        pre-trained from the data), or with `vision` the vision-language ones
        (built on a text model)."""
        return [m for m, e in self.config["models"].items() if e.get("embedded") and e.get("vision", False) == vision]

    def is_vision(self, model: str) -> bool:
        return bool(self.config["models"][model].get("vision", False))

    def text_model_of(self, model: str) -> str:
        """The embedded text model an embedded vision-language model is built on."""
        return self.config["models"][model]["build"]["text_model"]

    def templates_of(self, model: str) -> list[str]:
        """Paper A's templates audited on `model`: a vision-language model is
        paper B's testbed and runs paper B's arms only, and a model with
        secrets of its own is audited on those alone."""
        if self.is_vision(model) or self.own_secrets(model):
            return []
        return list(self.config["audit"]["templates"])

    def own_secrets(self, model: str) -> dict | None:
        """A model's `secrets` block: the researcher's own canaries it is
        audited on instead of the synthetic data (docs/own_secrets.md)."""
        return self.config["models"][model].get("secrets")

    def synthetic_models(self) -> list[str]:
        """The audited models that run the synthetic experiment."""
        return [m for m in self.config["audit"]["models"] if not self.own_secrets(m)]

    def secret_formats(self) -> dict[str, dict]:
        """model -> its own secrets' record format (RecordFormat.view), for
        the views' match rule and exposure's ceiling; the synthetic models'
        is the hex canaries' and not listed."""
        return {m: declared_format(self.own_secrets(m)).view() for m in self.config["audit"]["models"]
                if self.own_secrets(m)}

    def exposure_candidates(self, model: str) -> bool:
        """Whether `model`'s hex family has exposure candidates: the
        synthetic `data.n_exposure_candidates`, or an own-secrets block's
        declared format or candidates file."""
        own = self.own_secrets(model)
        if own:
            return bool(own.get("candidates")) or candidate_count(own) > 0
        return self.config["audit"]["hex_canaries"] and bool(self.config["data"]["n_exposure_candidates"])

    def model_path(self, model: str) -> str:
        entry = self.config["models"][model]
        return self.layout.base_dir(model) if entry.get("embedded") else entry["path"]

    def variants(self, model: str) -> dict[str, Variant]:
        """Every audited variant of `model`, in audit order.

        A memorization adapter and every unlearning checkpoint made from it
        share one probe group (one job per pass for the whole branch), the
        hex-canary adapters share the base model's, and every bSFT cell of
        one bSFT seed shares one group (the merged bases, the references of
        paper B's Deltas, ride with the first seed's)."""
        if model not in self._variants_of:
            self._variants_of[model] = self._variants(model)
        return self._variants_of[model]

    def _variants(self, model: str) -> dict[str, Variant]:
        audit, lay, base = self.config["audit"], self.layout, self.model_path(model)
        out = {"base": Variant("base", "base", base, (), None, "base")}
        if self.own_secrets(model):  # the model before the fine-tune, and the imports made from it
            out.update(self._import_variants(model, out))
            return out
        for seed in audit["seeds"]:
            for template in self.templates_of(model):
                mem = f"mem-{template}-s{seed}"
                out[mem] = Variant(mem, "memorized", base, (lay.adapter_dir(model, mem),), "base", mem,
                                   template=template, seed=seed)
                for run in self.unlearn_runs.values():
                    if template not in run.templates:
                        continue
                    for k in self.config["unlearn"]["k"]:
                        name = f"{run.name}-{template}-s{seed}-k{k}"
                        out[name] = Variant(name, "unlearned", base, (lay.adapter_dir(model, name),), mem, mem,
                                            template=template, seed=seed, run=run.name, method=run.method, k=k,
                                            settings=run.label())
                # The never-trained reference of this branch: the memorization
                # recipe on its data minus the fictional authors, scored with
                # the first branch of its retain form (formats.retain_form).
                ref = self.reference_of(template, seed)
                if ref not in out:
                    out[ref] = Variant(ref, "reference", base, (lay.adapter_dir(model, ref),), "base", mem,
                                       template=retain_form(template), seed=seed)
            if seed == audit["seeds"][0]:
                out.update(self._control_variants(model, seed))
            # Paper B's arms run on the first audit seed: its seed-level runs
            # are bSFT seeds on one canary LoRA (`bsft.seeds`), so a further
            # audit seed trains paper A's arms only, the ones its verdicts read.
            if audit["hex_canaries"] and seed == audit["seeds"][0]:
                canary = f"canary-s{seed}"
                out[canary] = Variant(canary, "canary", base, (lay.adapter_dir(model, canary),), "base", "base",
                                      seed=seed)
                # The never-trained reference: the canary LoRA's recipe on its
                # data minus the canaries (PrivLeak's and forget quality's anchor).
                ref = self.reference_of(None, seed)
                out[ref] = Variant(ref, "reference", base, (lay.adapter_dir(model, ref),), "base", "base", seed=seed)
                if self.bsft_active():
                    out.update(self._bsft_variants(model, seed))
                    out.update(self._control_hex_variants(model, seed))
        out.update(self._import_variants(model, out))
        return out

    def _control_variants(self, model: str, seed: int) -> dict[str, Variant]:
        """The planted controls of `model` (controls.py), for the first audit
        seed, where the model runs paper A's arms: a plant trains its own
        adapter, the BIO plant reads the memorization adapter again; all in
        the `controls` probe group, never pooled with the audit's variants."""
        if not self.templates_of(model):
            return {}
        lay, base, out = self.layout, self.model_path(model), {}
        for plant in active_plants(self.config):
            name = plant.variant(seed)
            adapter = lay.adapter_dir(model, f"{plant.reuse}-s{seed}" if plant.reuse else name)
            out[name] = Variant(name, CONTROL, base, (adapter,), "base", CONTROL_GROUP, template=plant.template,
                                seed=seed)
        return out

    def _control_hex_variants(self, model: str, seed: int) -> dict[str, Variant]:
        """Paper B's planted controls (controls.HEX_PLANTS) on the canary-merged
        base of `seed`: LoRAs stacked on it, judged against it like a bSFT
        cell (their cells' kind is `control`, which no paper B measure pools),
        in a probe group of their own; on text models (a vision-language
        record's positions start after its image block: not built)."""
        if self.is_vision(model):
            return {}
        lay, out = self.layout, {}
        for plant in active_plants(self.config, "B"):
            if plant.under and not self.undertrained_sources():
                continue  # no undertrained merged base to plant C5 on (bsft.controls.undertrained)
            if plant.canaries is not None and plant.canaries >= self.config["data"]["n_hex_canaries"]:
                continue  # a dilution to every canary is the plant itself
            name, under = plant.variant(seed), "-under" if plant.under else ""
            cell = {"cell": f"control {plant.name}", "kind": CONTROL, "source": plant.name,
                    "step": HEX_PLANT_RECIPE["steps"], "application": "stacked", "bsft_seed": 0, "canary_seed": seed}
            out[name] = Variant(name, CONTROL, lay.merged_dir(model, f"canary-s{seed}{under}"),
                                (lay.adapter_dir(model, name),), f"merged-s{seed}{under}", CONTROL_HEX_GROUP,
                                "stacked", cell, seed=seed)
        return out

    def hex_plant_slice(self, plant: str, seed: int) -> dict:
        """What a paper B plant's training reads: the bSFT LoRA's shape, the
        plant recipe, which token it overwrites and the window it is judged
        against (`tables.window_k`: where "past the window" begins)."""
        keep = ("r", "alpha", "targets")
        chosen = HEX_PLANTS[plant]
        return {**{k: self.bsft[k] for k in keep}, **HEX_PLANT_RECIPE, "at": chosen.at,
                "window_k": self.config["tables"]["window_k"], "seed": seed,
                **({"canaries": chosen.canaries} if chosen.canaries is not None else {})}

    def trained_hex_plants(self) -> list[str]:
        return [p.name for p in active_plants(self.config, "B")]

    def floor_plants(self) -> dict[str, int]:
        """model/variant -> canaries overwritten, for every C3 plant of the
        detection floor the run makes (the undiluted one: all of them)."""
        if not self.config["controls"].get("detection_floor"):
            return {}
        n, seed = self.config["data"]["n_hex_canaries"], self.config["audit"]["seeds"][0]
        return {f"{m}/{plant.variant(seed)}": plant.canaries or n for m in self.config["audit"]["models"]
                for plant in map(HEX_PLANTS.get, FLOOR_PLANTS) if plant.variant(seed) in self.variants(m)}

    def trained_plants(self) -> list[str]:
        """The control adapters the workflow trains (a reused one is not)."""
        return [p.name for p in active_plants(self.config) if not p.reuse]

    def plant_slice(self, plant: str, seed: int) -> dict:
        """What a control adapter's training reads: the memorization recipe,
        its control template and, for a retain-only plant, that flag."""
        p = PLANTS[plant]
        if p.retain_only:  # no author example: the head length is not read
            return {**self.config["memorize"], "template": p.template, "seed": seed, "retain_only": True}
        return {**self.config["memorize"], "template": p.template, "seed": seed,
                "head_tokens": self.config["data"]["head_tokens"]}

    def think_opens(self) -> dict[str, str]:
        """model -> its opening think tag, for the models that run paper A's
        arms (the controls' spill-over reads the trace after it)."""
        return {m: self.config["models"][m]["think_open"] for m in self.config["audit"]["models"]
                if self.templates_of(m)}

    def control_claims(self) -> dict[str, str]:
        """The controls table's rows: each switched-on claim, with why it is
        not run ("" where it runs), where any control runs."""
        if not self.control_variants():
            return {}
        return {c.key: skipped(self.config).get(c.key, "") for c in switched_on(self.config)}

    def control_variants(self) -> list[str]:
        """model/variant of every planted control."""
        return [f"{m}/{v}" for m in self.config["audit"]["models"] for v, e in self.variants(m).items()
                if e.kind == CONTROL]

    # --- imports ---------------------------------------------------------

    def imports(self, model: str) -> dict[str, Import]:
        """The model's imports by variant name (models.<model>.imports)."""
        self.variants(model)
        return self._imports_of[model]

    def export_sources(self, model: str, seed: int) -> dict:
        """What `export` writes for one model and seed: each memorization
        adapter by template, and the hex-canary adapter with its merged base
        (made by the canary LoRA's job when paper B's bSFT arms run, else by
        the export)."""
        if self.own_secrets(model):
            raise ConfigError(f"export of model `{model}`: it is audited on its own secrets "
                              f"(`models.{model}.secrets`), and export writes the synthetic experiment's memorized "
                              "models and splits; export a model that runs the experiment")
        if seed not in self.config["audit"]["seeds"]:
            raise ConfigError(f"export of seed {seed}: `audit.seeds` is {self.config['audit']['seeds']}")
        lay = self.layout
        canary = None
        if self.config["audit"]["hex_canaries"] and seed == self.config["audit"]["seeds"][0]:
            name = f"canary-s{seed}"
            merged = lay.merged_dir(model, name) if self.bsft_active() else None
            canary = [lay.adapter_dir(model, name), merged]
        return {"memorized": {t: lay.adapter_dir(model, f"mem-{t}-s{seed}") for t in self.templates_of(model)},
                "canary": canary, "head_tokens": self.config["data"]["head_tokens"]}

    def import_check(self, model: str, variant: str) -> dict | None:
        """What the manifest job of an imported variant checks its weights
        against (imports.check_fits): its config entry and the model's base
        folder, which for an embedded model exists only once built."""
        if variant not in self.imports(model):
            return None
        return {"model": model, "name": variant, "entry": self.config["models"][model]["imports"][variant],
                "base": self.model_path(model)}

    def _import_variants(self, model: str, design: dict[str, Variant]) -> dict[str, Variant]:
        """Each import as a variant of its own probe group, after its parent
        (which may be another import): refused, naming the key, when its
        files cannot be audited, its name is the design's, its parent is
        unknown or of the wrong kind, or imports form a cycle."""
        entries = self.config["models"][model].get("imports", {})
        try:
            found = {name: resolve(model, name, entry) for name, entry in entries.items()}
        except ImportRefused as err:
            raise ConfigError(str(err)) from None
        self._imports_of[model] = found
        out: dict[str, Variant] = {}
        for name, imp in found.items():
            if name in design:
                raise ConfigError(f"config key `{imp.key}`: `{name}` names a variant of the design; rename the "
                                  "import")
        known = {**design}

        def place(name: str, path: tuple[str, ...]) -> None:
            imp = found[name]
            if name in out:
                return
            if imp.parent in path:
                raise ConfigError(f"config key `{imp.key}.parent`: imports form a cycle "
                                  f"({' -> '.join((*path, imp.parent))}); give one of them a variant of the design "
                                  "as its parent")
            if imp.parent in found and imp.parent not in out:
                place(imp.parent, (*path, imp.parent))
            if imp.parent not in known:
                raise ConfigError(f"config key `{imp.key}.parent` is `{imp.parent}`, which is not a variant of model "
                                  f"`{model}` (known: {', '.join(sorted(known))})")
            out[name] = known[name] = self._import_variant(imp, known[imp.parent])

        for name in found:
            place(name, (name,))
        return out

    def _import_variant(self, imp: Import, parent: Variant) -> Variant:
        if imp.role == "tuned" and not self.own_secrets(imp.model):
            raise ConfigError(f"config key `{imp.key}.as`: `tuned` is a fine-tune on the model's own secrets, but "
                              f"`models.{imp.model}.secrets` is not set; give the secrets, or import it "
                              "`as: changed`")
        allowed = PARENT_KINDS[imp.role]
        if allowed and parent.kind not in allowed:
            raise ConfigError(f"config key `{imp.key}.parent`: `as: {imp.role}` needs a parent of kind "
                              f"{' or '.join(allowed)}; `{parent.name}` is {parent.kind}")
        if imp.form == CHECKPOINT:
            base, adapters = str(imp.path), ()
        else:
            below = parent.adapters if imp.on == "parent" else parent.adapters[:-1]
            base, adapters = parent.base, (*below, str(imp.path))
        label = imp.label or imp.name
        cell = None
        if imp.role == "bsft":
            cell = {"cell": f"import {label}", "kind": "bsft", "source": label, "step": 0,
                    "application": imp.application, "bsft_seed": 0, "canary_seed": parent.seed}
        return Variant(
            imp.name, imp.role, base, adapters, parent.name, imp.group,
            imp.application if imp.role == "bsft" and imp.form == ADAPTER else "stacked", cell,
            template=parent.template, seed=parent.seed, run=label if imp.role == "unlearned" else None,
            method="import" if imp.role == "unlearned" else None, k=imp.k, settings=f"imported from {imp.path}")

    def _bsft_variants(self, model: str, seed: int) -> dict[str, Variant]:
        """Paper B's cells on the canary LoRA of `seed`: each source's bSFT
        adapter at each training length, stacked on or merged into the merged
        base, and the controls; every cell once per bSFT seed."""
        b, lay, canary = self.bsft, self.layout, f"canary-s{seed}"
        under = f"{canary}-under"
        ref, ref_under = f"merged-s{seed}", f"merged-s{seed}-under"
        first = f"bsft-s{seed}-b{b['seeds'][0]}"
        out = {ref: Variant(ref, "merged_base", lay.merged_dir(model, canary), (), canary, first, seed=seed)}
        if self.undertrained_sources():
            out[under] = Variant(under, "canary_undertrained", self.model_path(model),
                                 (lay.adapter_dir(model, under),), "base", "base", seed=seed)
            out[ref_under] = Variant(ref_under, "merged_base", lay.merged_dir(model, under), (), under, first,
                                     seed=seed)
        last = max(b["steps"])

        def cell(label, kind, source, step, application, bseed):
            return {"cell": label, "kind": kind, "source": source, "step": step, "application": application,
                    "bsft_seed": bseed, "canary_seed": seed}

        for bseed in b["seeds"]:
            group = f"bsft-s{seed}-b{bseed}"
            for source in b["sources"]:
                for step in b["steps"]:
                    for app in b["applications"]:
                        name = f"bsft-{source}-t{step}-{app}-b{bseed}-s{seed}"
                        out[name] = Variant(
                            name, "bsft", lay.merged_dir(model, canary),
                            (lay.bsft_dir(model, canary, source, bseed, f"t{step}"),), ref, group, app,
                            cell(f"{source} t{step} {app}", "bsft", source, step, app, bseed), seed=seed)
            for source in b["controls"]["noise"]["sources"]:
                name = f"noise-{source}-b{bseed}-s{seed}"
                out[name] = Variant(
                    name, "noise", lay.merged_dir(model, canary),
                    (lay.bsft_dir(model, canary, source, bseed, "noise"),), ref, group, "stacked",
                    cell(f"noise {source}", "noise", source, last, "stacked", bseed), seed=seed)
            for source in self.undertrained_sources():
                name = f"under-{source}-b{bseed}-s{seed}"
                out[name] = Variant(
                    name, "undertrained", lay.merged_dir(model, under),
                    (lay.bsft_dir(model, under, source, bseed, f"t{last}"),), ref_under, group, "stacked",
                    cell(f"undertrained {source}", "undertrained", source, last, "stacked", bseed), seed=seed)
        return out

    def variant(self, model: str, name: str) -> Variant:
        """One variant of `model`, or an error naming the known ones."""
        table = self.variants(model)
        if name not in table:
            raise ConfigError(f"variant `{name}` of model `{model}` is not in the audit "
                              f"(known: {', '.join(sorted(table))})")
        return table[name]

    def group(self, model: str, group: str) -> list[str]:
        """The variants of one probe group, or an error naming the known groups."""
        groups = self.probe_groups(model)
        if group not in groups:
            raise ConfigError(f"probe group `{group}` of model `{model}` is not in the audit "
                              f"(known: {', '.join(sorted(groups))})")
        return groups[group]

    def made_weights(self, model: str, names: list[str]) -> list[str]:
        """The adapters and workflow-made bases (merged bases) `names` read:
        what their jobs take as input, beside the model's own base."""
        table, base = self.variants(model), self.model_path(model)
        folders = {str(imp.path) for imp in self.imports(model).values()}
        paths = {p for n in names for p in (*table[n].adapters, table[n].base) if p != base}
        # An import's folder is not a DAG product: its weight files are the
        # inputs, so an import rewritten in place re-runs its jobs.
        return sorted(q for p in paths for q in (self._weight_files(p) if p in folders else [p]))

    @staticmethod
    def _weight_files(folder: str) -> list[str]:
        return sorted(str(f) for f in Path(folder).glob("*.safetensors"))

    def records_files(self, kind: str, fine: bool) -> list[str]:
        """Every records file of `kind` the tables read: one per probe group,
        or one per (variant, probe unit) under the fine grain."""
        lay, models = self.layout, self.config["audit"]["models"]
        if fine:
            return [lay.unit_records(m, v, u, kind) for m in models for v in self.variants(m)
                    for u in self.variant_units(m, v, kind)]
        return [lay.group_records(m, g, kind) for m in models for g in self.probe_groups(m)]

    def unlearn_slice(self, run: str, template: str, seed: int, k: int | None) -> dict:
        """What one unlearning job reads: its run's method and effective
        settings, and the K it stops at (a segment, under the fine grain) or
        the whole sweep (`k` None)."""
        if run not in self.unlearn_runs:
            raise ConfigError(f"unlearning run `{run}` is not in `unlearn.runs` ({', '.join(self.unlearn_runs)})")
        r, block = self.unlearn_runs[run], self.config["unlearn"]
        return {
            **r.shared, "method": r.method, "settings": r.method_settings, "template": template, "seed": seed,
            "head_tokens": self.config["data"]["head_tokens"],
            "gradient_checkpointing": block["gradient_checkpointing"],
            "k": k if k is not None else sorted(block["k"]),
        }

    def model_entry(self, model: str, path: str | None = None) -> dict:
        """The model entry a job reads; `path` replaces the base weights (a
        merged base) and keeps the tokenizer settings."""
        entry = self.config["models"][model]
        think_open, think_close = ModelSpec.think_tags(entry)
        return {"name": model, "path": path or self.model_path(model), **{k: entry.get(k) for k in MODEL_KEYS},
                "think_open": think_open, "think_close": think_close}

    def prefills(self, group: str | None = None) -> dict[str, str]:
        """The prefill arms a probe group runs: the config's (`probes.prefills`)
        on the audit's groups; on the controls group the contrast arm and the
        controls' own arms (controls.CONTROL_ARMS) alone; every arm of the
        run with None (the units whose records the tables expect)."""
        audit = self.config["probes"]["prefills"]
        if not any(e.group == CONTROL_GROUP for m in self.config["audit"]["models"] for e in self.variants(m).values()):
            return audit
        contrast = self.config["tables"]["prefill_contrast"]
        controls = {**({contrast: audit[contrast]} if contrast in audit else {}), **CONTROL_ARMS}
        if group is None:
            return {**audit, **controls}
        return controls if group == CONTROL_GROUP else audit

    def probe_slice(self, kind: str, sets: str = ALL_SETS, group: str | None = None) -> dict:
        """What a probe pass of `kind` (`decode`, `teacher_forced`) reads; for
        a group that runs `sets` (probe_sets_of), only the settings its
        records' units read: no prefill texts without the author probes, no
        hex-sampling setting without the hex probes, so changing one re-runs
        only the jobs whose records depend on it.  The prefill arms are the
        group's (`prefills`); with no group, every arm of the run."""
        full = {**self.config["probes"][kind], "prefills": self.prefills(group),
                "head_tokens": self.config["data"]["head_tokens"]}
        if sets == HEX:
            return {**full, "prefills": {}}
        if sets == AUTHOR_SETS:
            return {k: v for k, v in full.items() if k not in HEX_ONLY}
        return full

    def probe_hashes(self) -> dict[str, dict[str, str]]:
        """Per kind of record, the config hash each probe unit's records must
        carry (probes/units.py): tables refuse others."""
        from canary_audit.probes.passes import unit_hashes

        return {"decode": unit_hashes(self.probe_slice("decode")),
                "token": unit_hashes(self.probe_slice("teacher_forced"))}

    def probe_groups(self, model: str) -> dict[str, list[str]]:
        """Probe group -> the variants it scores, in audit order."""
        groups: dict[str, list[str]] = {}
        for name, v in self.variants(model).items():
            groups.setdefault(v.group, []).append(name)
        return groups

    def probe_sets_of(self, model: str, group: str) -> str:
        """The probe sets a group runs.  bSFT groups run the hex-canary probes
        only (paper B's cells are judged on them), and so does every group of
        a model without paper A's templates; a memorization group (its
        adapter and unlearning checkpoints, which never saw a hex canary) runs
        the author and retain probes only; the base group, the parent of both
        papers' variants and home of the hex-canary adapters, runs all, and
        the author probes alone where no hex canary is audited
        (`audit.hex_canaries: false`: no hex work nobody asked for)."""
        imported = {imp.group: imp for imp in self.imports(model).values()}
        if group in imported:  # an import runs its parent's probe sets
            return self.probe_sets_of(model, self.variants(model)[imported[group].parent].group)
        if not self.templates_of(model) or group.startswith("bsft-") or group == CONTROL_HEX_GROUP:
            return HEX
        if group == "base":
            return ALL_SETS if self.config["audit"]["hex_canaries"] else AUTHOR_SETS
        return AUTHOR_SETS

    def variant_units(self, model: str, variant: str, kind: str) -> list[str]:
        """The probe units of a variant's `kind` records under the fine grain:
        where its group runs the author probes, AUTO (decode only) and each
        prefill arm; where it runs the hex probes, the hex unit."""
        group = self.variants(model)[variant].group
        sets = self.probe_sets_of(model, group)
        authors = sets != HEX
        prefills = sorted(self.prefills(group)) if authors else []
        auto = [AUTO] if authors and kind == "decode" else []  # AUTO author probes decode only
        hex_ = [HEX_UNIT] if sets != AUTHOR_SETS else []
        return [*auto, *hex_, *prefills]

    # --- what the views read ---------------------------------------------

    def variant_table(self) -> dict[str, dict]:
        """model/variant -> its structured fields, for the views."""
        return {f"{m}/{v}": {**e.fields(), "model": m, "parent": f"{m}/{e.parent}" if e.parent else None}
                for m in self.config["audit"]["models"] for v, e in self.variants(m).items()}

    @staticmethod
    def reference_of(template: str | None, seed: int) -> str:
        """The never-trained reference variant of a memorization branch
        (`template`; named by its retain form, which BIO and META share) or,
        with None, of the canary LoRA of `seed`."""
        return f"reference-{retain_form(template)}-s{seed}" if template else f"reference-s{seed}"

    def references(self) -> dict[str, dict[str, str]]:
        """model/variant -> its never-trained reference and the canary family
        (`population`, records.MIA_POPULATIONS) it is the reference for: for
        every variant derived from a canary LoRA (the canary LoRA, its merged
        base, its undertrained copy and every bSFT cell) the canary recipe's
        (hex canaries), for the memorization adapter and every unlearning
        checkpoint made from it the memorization recipe's of its template
        (author canaries).  A variant is compared with a reference only on
        the family that reference never saw."""
        canary = ("canary", "merged_base", "canary_undertrained", "bsft", "noise", "undertrained")
        author = ("memorized", "unlearned")
        out = {f"{m}/{v}": {"reference": f"{m}/{self.reference_of(e.template, e.seed)}", "population": "author"}
               if e.kind in author else
               {"reference": f"{m}/{self.reference_of(None, e.seed)}", "population": "hex"}
               for m in self.synthetic_models() for v, e in self.variants(m).items()
               if e.kind in canary + author}
        # Own secrets: the model before the fine-tune is every variant's
        # reference, where it never saw the secrets (`secrets.reference: before`).
        for m in self.config["audit"]["models"]:
            own = self.own_secrets(m)
            if own and setting(own, "reference") == "before":
                out |= {f"{m}/{v}": {"reference": f"{m}/base", "population": "hex"} for v in self.variants(m)
                        if v != "base"}
        return out

    def strata(self) -> dict[str, int]:
        """Canary id -> how many times it is inserted in the canary LoRA's
        data (`audit.hex_repetitions`), for every hex canary and, with a
        vision-language model audited, every image canary; empty with one
        stratum (nothing to report per stratum)."""
        reps = self.config["audit"]["hex_repetitions"]
        if len(reps) < 2:
            return {}
        data = self.config["data"]
        out = strata([HEX_ID.format(i) for i in range(data["n_hex_canaries"])], reps)
        if any(self.is_vision(m) for m in self.config["audit"]["models"]):
            out |= strata([IMAGE_ID.format(i) for i in range(data["n_image_canaries"])], reps)
        return out

    def parents(self) -> dict[str, str]:
        return {name: row["parent"] for name, row in self.variant_table().items() if row["parent"]}

    def weights_bytes(self, model: str) -> int:
        """The bytes of a model's base weights on disk (0 for an embedded
        model not built yet; it is tiny)."""
        return sum(f.stat().st_size for f in Path(self.model_path(model)).glob("*.safetensors"))

    def gpu_entry(self, model: str) -> bool:
        """Whether a model's jobs ask a cluster for a GPU: a local checkpoint
        run in bf16 or fp16 (a 7B model's precision on a card; the embedded
        models and float32 entries run on the CPU)."""
        entry = self.config["models"][model]
        return not entry.get("embedded") and entry.get("dtype", "float32") != "float32"

    def merge_precisions(self) -> dict[str, str]:
        """model -> the precision its merges round into (ModelSpec.merge_precision)."""
        return {m: ModelSpec.from_config(m, self.config["models"][m], "").merge_precision
                for m in self.config["audit"]["models"]}

    def cells(self) -> dict[str, dict]:
        """model/variant -> its paper B cell (name, kind, source, step, application, seeds)."""
        return {f"{m}/{v}": {**e.cell, "model": m} for m in self.config["audit"]["models"]
                for v, e in self.variants(m).items() if e.cell is not None}

    def table_names(self) -> list[str]:
        """The tables this config's audit produces: the one registry the
        tables job writes (each, empty with a reason where the records hold
        none), the workflow expects and the plots read.  Paper A's tables
        only where some audited model runs paper A's arms (a
        vision-language model runs paper B's only)."""
        models = self.config["audit"]["models"]
        names = list(PAPER_A_TABLES) if any(self.templates_of(m) for m in models) else []
        if names and len(self.config["audit"]["seeds"]) > 1:
            names.append(SEED_TABLE)
        if self.control_variants():
            names.append(CONTROLS_TABLE)
        if self.floor_plants():
            names.append(FLOOR_TABLE)
        synthetic_hex = self.config["audit"]["hex_canaries"] and bool(self.synthetic_models())
        if synthetic_hex or len(self.synthetic_models()) < len(models):
            # No candidates (synthetic `data.n_exposure_candidates: 0`, own
            # secrets without a format or candidates file): no exposure table.
            names += [t for t in HEX_TABLES if (t != "exposure" or any(self.exposure_candidates(m) for m in models))
                      and (t != "strata" or self.strata())]
            if synthetic_hex and self.bsft_active():
                names += BSFT_TABLES
                if len(self.bsft["applications"]) > 1 and self.bsft["sources"]:
                    names.append(MERGED_VS_STACKED)
        return [*names, *ALWAYS_TABLES]

    # --- checks ----------------------------------------------------------

    def _check_audit(self) -> None:
        """What is audited: something, on models the config has, with the
        think tags paper A's arms need.  (A local checkpoint's own files are
        checked by the workflow, which loads its tokenizer.)"""
        cfg, audit = self.config, self.config["audit"]
        own = [m for m in audit["models"] if cfg["models"].get(m, {}).get("secrets")]
        if not audit["templates"] and not audit["hex_canaries"] and not own:
            raise ConfigError(
                "nothing to audit: `audit.templates` is empty (no paper A arms) and `audit.hex_canaries` is "
                "false (no paper B arms); set either"
            )
        reps = audit["hex_repetitions"]
        if len(reps) > 1:
            if not audit["hex_canaries"]:
                raise ConfigError(f"config key `audit.hex_repetitions` is {reps}, but `audit.hex_canaries` is false: "
                                  "there is no canary LoRA to stratify; set it to [1] or train the hex canaries")
            counts = {"data.n_hex_canaries": cfg["data"]["n_hex_canaries"]}
            if any(cfg["models"].get(m, {}).get("vision") for m in audit["models"]):
                counts["data.n_image_canaries"] = cfg["data"]["n_image_canaries"]
            for key, n in counts.items():
                if n < len(reps):
                    raise ConfigError(f"config key `audit.hex_repetitions` names {len(reps)} strata, but `{key}` is "
                                      f"{n}: a stratum would hold no canary; raise `{key}` or name fewer strata")
        known = sorted(cfg["models"])
        for name in audit["models"]:
            if name not in cfg["models"]:
                raise ConfigError(
                    f"config key `audit.models` names `{name}`, which is not in `models` (known: {', '.join(known)}); "
                    f"add a `models.{name}` entry or remove it"
                )
            entry = cfg["models"][name]
            if entry.get("embedded") and not entry.get("vision") and "text_model" in entry["build"]:
                raise ConfigError(
                    f"config key `models.{name}.build.text_model` is set, but `{name}` is a text model (it "
                    f"builds its own language model); remove the key, or set `models.{name}.vision: true`"
                )
            if entry.get("secrets"):
                pass  # audited on its own secrets: no paper arm, no think tags needed
            elif entry.get("vision"):
                self._check_vision(name, entry)
            elif audit["templates"] and ModelSpec.think_tags(entry)[1] is None:
                raise ConfigError(
                    f"model `{name}` has no think tags (`models.{name}.think_close` is null), but paper A's arms "
                    f"need them (`audit.templates`: {', '.join(audit['templates'])}); set the model's tags, or "
                    "set `audit.templates: []` to audit paper B's arms only"
                )
            if not entry.get("embedded") and not entry.get("path"):
                raise ConfigError(f"model `{name}` is not embedded and has no `models.{name}.path`; set the "
                                  "local checkpoint directory")

    def _check_secrets(self) -> None:
        """Each audited model's own secrets, read and checked before any
        job (data/secrets.load_own_secrets): columns, duplicates, members
        among the non-members, the declared format, images; and an embedded
        model cannot take them (it is pre-trained on the synthetic data)."""
        for model in self.config["audit"]["models"]:
            spec = self.own_secrets(model)
            if not spec:
                continue
            if self.config["models"][model].get("embedded"):
                raise ConfigError(f"config key `models.{model}.secrets`: `{model}` is an embedded model, built for "
                                  "the synthetic experiment; give your model a `path` entry of its own")
            try:
                load_own_secrets(model, spec, self.is_vision(model))
            except SecretsRefused as err:
                raise ConfigError(str(err)) from None

    def _check_vision(self, name: str, entry: dict) -> None:
        """A vision-language model audits paper B's image and text canaries:
        it needs the hex-canary arms, and an embedded one the embedded text
        model its language tower is built from."""
        cfg = self.config
        if not cfg["audit"]["hex_canaries"]:
            raise ConfigError(
                f"model `{name}` is vision-language (`models.{name}.vision`), which is audited on paper B's "
                "canary arms only, but `audit.hex_canaries` is false; set it to true or remove the model"
            )
        if not entry.get("embedded"):
            return
        text = entry["build"].get("text_model")
        known = [m for m, e in cfg["models"].items() if e.get("embedded") and not e.get("vision")]
        if text not in known:
            raise ConfigError(
                f"config key `models.{name}.build.text_model` is `{text}`: an embedded vision-language model is "
                f"built on an embedded text model (known: {', '.join(known) or 'none'}); name one"
            )

    def depth(self, model: str) -> int | None:
        """The decoder layers of `model`'s checkpoint: an embedded text
        model's build, a local checkpoint's config.json (a vision-language
        one's text config); None where it cannot be read yet (an embedded
        vision-language model: its text model's)."""
        import json

        entry = self.config["models"][model]
        if entry.get("embedded"):
            build = entry.get("build", {})
            if entry.get("vision"):
                return self.depth(build["text_model"]) if build.get("text_model") in self.config["models"] else None
            return build.get("architecture", {}).get("num_layers")
        config = Path(entry["path"]) / "config.json"
        if not config.is_file():
            return None
        found = json.loads(config.read_text())
        return found.get("num_hidden_layers") or found.get("text_config", {}).get("num_hidden_layers")

    def _check_layers(self) -> None:
        """A layer setting (RMU's steered layer) within the depth of every
        model it would train on, before any job: otherwise it stops only when
        its unlearning job starts, after the memorization adapters trained."""
        for name, run in self.unlearn_runs.items():
            layer = run.method_settings.get("layer")
            if layer is None:
                continue
            for model in self.config["audit"]["models"]:
                depth = self.depth(model)
                if self.templates_of(model) and depth is not None and layer > depth:
                    raise ConfigError(f"config key `unlearn.runs.{name}.layer` is {layer}, but model `{model}` has "
                                      f"{depth} decoder layers; choose 1..{depth}")

    def _check_arms(self) -> None:
        """Cross-key checks of the arms: the undertrained control, prefill
        texts and the prefill contrast."""
        cfg = self.config
        under = self.bsft["controls"]["undertrained"]
        steps = cfg["canary_lora"]["steps"]
        if under["sources"] and not under["canary_steps"] < steps:
            raise ConfigError(
                f"config key `bsft.controls.undertrained.canary_steps` is {under['canary_steps']}, which the "
                f"canary LoRA run does not stop before (`canary_lora.steps`: {steps}); set it below {steps}"
            )
        try:
            check_prefill_templates(cfg["probes"]["prefills"])
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self._check_controls()
        self._check_layers()
        contrast = cfg["tables"]["prefill_contrast"]
        if cfg["probes"]["prefills"] and contrast not in cfg["probes"]["prefills"]:
            raise ConfigError(
                f"config key `tables.prefill_contrast` is `{contrast}`, which is not a prefill arm "
                f"(`probes.prefills`: {', '.join(sorted(cfg['probes']['prefills'])) or 'none'}); name one of them"
            )

    def _check_controls(self) -> None:
        """Refuse a prefill arm named like a planted control's.  (A switched-on
        control whose templates are not memorized is not refused: the
        controls table lists it as not run, with why; controls.skipped.)"""
        cfg = self.config
        clash = sorted(set(cfg["probes"]["prefills"]) & set(CONTROL_ARMS))
        if clash:
            raise ConfigError(f"config key `probes.prefills.{clash[0]}`: `{clash[0]}` names a planted control's "
                              f"prefill arm (controls.CONTROL_ARMS); rename the arm")

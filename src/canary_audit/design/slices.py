"""Job slices: exactly the config each job depends on (its params, so a
change re-runs what it touches), and the files and groups a job reads."""

from __future__ import annotations

from pathlib import Path

from canary_audit.core.records import AUTO
from canary_audit.core.records import HEX as HEX_UNIT
from canary_audit.data.inclusion import per_seed
from canary_audit.data.planted_controls import (
    CONTROL_ARMS,
    HEX_PLANTS,
    PLANTS,
    hex_plant_recipe,
    is_control_group,
)
from canary_audit.data.secrets import image_files
from canary_audit.design.layout import (
    ALL_SETS,
    AUTHOR_SETS,
    HEX,
    MODEL_KEYS,
    ConfigError,
)
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.kinds import kind_named, probe_kinds
from canary_audit.probes.units import HEX_ONLY, unit_hashes


def resolved_settings(configured: dict, family: str | None = None) -> dict[str, dict]:
    """Each kind's settings (of `family`, or all) with its defaults filled in,
    for the kinds that have any: the `kinds` entry of a pass's config.
    A key a kind does not take, or a kind that does not exist, is refused.
    The one place a kind's defaults are filled: the job reads what the
    pass config gives (items.own_settings)."""
    for name, given in configured.items():
        kind = kind_named(name)
        extra = sorted(set(given) - set(kind.settings))
        if extra:
            raise ValueError(f"config key `probes.kinds.{name}`: `{kind.name}` takes no setting "
                             f"{', '.join(f'`{k}`' for k in extra)}; its settings: "
                             f"{', '.join(kind.settings) or 'none'}")
    out = {k.name: {**k.settings, **configured.get(k.name, {})} for k in probe_kinds()
           if k.settings and (family is None or k.family == family)}
    for name, values in out.items():
        check = kind_named(name).check
        if check is not None:
            check(values)
    return out


class Slices:
    """The config slice each job's params carry, and what a job reads.
    A part of `Design` (core.py)."""

    def hex_plant_records(self, model: str) -> int:
        """The hex canary records a paper B plant on `model` trains on: the
        text canaries, and on a vision-language model its image canaries too
        (one LoRA over both)."""
        data = self.config["data"]
        return data["n_hex_canaries"] + (data["n_image_canaries"] if self.is_vision(model) else 0)

    def hex_plant_slice(self, model: str, plant: str, seed: int) -> dict:
        """What a paper B plant's training reads: the bSFT LoRA's shape, the
        plant recipe at the model's record count (each record drawn as
        often on both backbones), which token it overwrites, what it holds
        the rest to, and the window it is judged against (`tables.window_k`:
        where "past the window" begins)."""
        keep = ("r", "alpha", "targets")
        chosen = HEX_PLANTS[plant]
        return {**{k: self.bsft[k] for k in keep}, **hex_plant_recipe(self.hex_plant_records(model)),
                "at": chosen.at, "anchor": chosen.anchor, "weight": chosen.weight,
                **({"hold": chosen.hold} if chosen.hold is not None else {}),
                "window_k": self.config["tables"]["window_k"], "seed": seed,
                **({"canaries": chosen.canaries} if chosen.canaries is not None else {})}

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
        models = self.config["audit"]["models"]
        if not any(is_control_group(e.group) for m in models for e in self.variants(m).values()):
            return audit
        contrast = self.config["tables"]["prefill_contrast"]
        controls = {**({contrast: audit[contrast]} if contrast in audit else {}), **CONTROL_ARMS}
        if group is None:
            return {**audit, **controls}
        return controls if is_control_group(group) else audit

    def probe_slice(self, kind: str, sets: str = ALL_SETS, group: str | None = None) -> dict:
        """What a probe pass of `kind` (`decode`, `teacher_forced`) reads; for
        a group that runs `sets` (probe_sets_of), only the settings its
        records' units read: no prefill texts without the author probes, no
        hex-sampling setting without the hex probes, so changing one re-runs
        only the jobs whose records depend on it.  The prefill arms are the
        group's (`prefills`); with no group, every arm of the run."""
        full = {**self.config["probes"][kind], "prefills": self.prefills(group),
                "head_tokens": self.config["data"]["head_tokens"]}
        family = {HEX: "hex", AUTHOR_SETS: "author"}.get(sets)
        kinds = {name: v for name, v in resolved_settings(self.config["probes"].get("kinds", {}), family).items()
                 if kind in kind_named(name).passes}
        if kinds:  # only a probe kind with settings of its own adds the key
            full["kinds"] = kinds
        if sets == HEX:
            return {**full, "prefills": {}}
        if sets == AUTHOR_SETS:
            return {k: v for k, v in full.items() if k not in HEX_ONLY}
        return full

    def probe_hashes(self) -> dict[str, dict[str, str]]:
        """Per kind of record, the config hash each probe unit's records must
        carry (probes/units.py): tables refuse others."""
        return {"decode": unit_hashes(self.probe_slice("decode")),
                "token": unit_hashes(self.probe_slice("teacher_forced"))}

    def probe_groups(self, model: str) -> dict[str, list[str]]:
        """Probe group -> the variants it scores, in audit order."""
        groups: dict[str, list[str]] = {}
        for name, v in self.variants(model).items():
            groups.setdefault(v.group, []).append(name)
        return groups

    def probe_sets_of(self, model: str, group: str) -> str:
        """The probe sets a group runs.  A group of paper B's cells (bSFT,
        noise, undertrained, the planted hex controls) and their merged bases
        runs the hex family only (paper B's cells are judged on it), and so does every group of
        a model without paper A's templates; a memorization group (its
        adapter and unlearning checkpoints, which never saw a hex canary) runs
        the author and retain probes only; the base group, the parent of both
        papers' variants and home of the hex-canary adapters, runs all, and
        the author probes alone where no hex canary is audited
        (`audit.hex_canaries: false`: no hex work nobody asked for)."""
        imported = {imp.group: imp for imp in self.imports(model).values()}
        if group in imported:  # an import runs its parent's probe sets
            return self.probe_sets_of(model, self.variants(model)[imported[group].parent].group)
        members = [v for v in self.variants(model).values() if v.group == group]
        # Paper B's cells and their merged bases:
        paper_b = bool(members) and all(v.cell is not None or v.kind == "merged_base" for v in members)
        if not self.templates_of(model) or paper_b:
            return HEX
        if group == "base":
            return ALL_SETS if self.config["audit"]["hex_canaries"] else AUTHOR_SETS
        return AUTHOR_SETS

    def data_seed(self, model: str, names: list[str]) -> int | None:
        """The training seed whose data folder a job over the variants
        `names` reads (`data/s<seed>/`, rule seed_data), or None for the data
        folder: under coin inclusion each seed's forget set is its own coins'
        (data/inclusion.py), so a job whose variants ran the author probes
        under one seed reads that seed's; a seedless variant (the base)
        reads the data folder, and a job may not mix seeds."""
        if not per_seed(self.config["data"]) or self.own_secrets(model):
            return None
        table = self.variants(model)
        seeds = {table[n].seed for n in names}
        if None in seeds:
            return None
        if len(seeds) > 1:
            raise ConfigError(f"variants {', '.join(names)} of model `{model}` read the authors under training seeds "
                              f"{sorted(seeds)} in one job; under `data.inclusion: coin` each seed has its own "
                              "forget set, so each job must hold one seed's variants")
        return seeds.pop()

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

    def canary_slice(self, seed: int) -> dict:
        """The canary LoRA job's params: its recipe, the repetition strata,
        its seed, and the undertrained checkpoint's step where paper B's
        undertrained control runs."""
        extra = {}
        if self.bsft_active() and self.undertrained_sources():
            extra["undertrained_steps"] = self.bsft["controls"]["undertrained"]["canary_steps"]
        return {**self.config["canary_lora"], **extra, "repetitions": self.config["audit"]["hex_repetitions"],
                "seed": seed}

    def bsft_slice(self, source: str, bseed: int) -> dict:
        """A bSFT run's params: the recipe, every audited training length (its
        checkpoints), its source and bSFT seed."""
        b = self.bsft
        keep = ("r", "alpha", "targets", "lr", "batch_size", "gradient_checkpointing")
        return {**{k: b[k] for k in keep}, "steps": sorted(b["steps"]), "source": source, "seed": bseed}

    def own_secret_sources(self, model: str) -> list[str]:
        """The files a model's own secrets are read from (and their images): a
        changed file re-runs the secrets' tables and that model's passes."""
        spec = self.own_secrets(model) or {}
        files = [spec[k] for k in ("members", "nonmembers", "candidates") if spec.get(k)]
        return files + (image_files(spec) if self.is_vision(model) else [])

"""Variant enumeration: every audited variant of a model, with structured
fields, in the order the workflow plans them (memorization branches,
references, planted controls, the canary LoRA and paper B's cells)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from canary_audit.data.chat_format import retain_form
from canary_audit.data.inclusion import included, per_seed
from canary_audit.data.planted_controls import (
    CONTROL,
    CONTROL_HEX_GROUP,
    EVERY_SEED,
    FLOOR_COMPOSED,
    FLOOR_PLANTS,
    HEX_PLANTS,
    ON_VISION,
    SUPPRESS,
    active_plants,
    control_group,
    hex_plant_recipe,
    skipped,
    switched_on,
)
from canary_audit.data.relearn import FORGET, attack_name, relearned_authors
from canary_audit.design.layout import (
    ConfigError,
    Variant,
)
from canary_audit.model.quantize import RECOVERY, RECOVERY_PLANT
from canary_audit.verdicts.claims import select


def unlearned_fields(design: dict[str, Variant]) -> dict[str, dict]:
    """The unlearned variants of one model's design with the fields a
    recovery selector reads (its name as `variant`)."""
    return {n: {**v.fields(), "variant": n} for n, v in design.items() if v.kind == "unlearned"}


class Variants:
    """The variants a model's audit holds, built once per model and cached.
    A part of `Design` (core.py)."""

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
            out.update(self._recovery_variants(model, out))
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
            if seed == audit["seeds"][0] or self.config["controls"].get(EVERY_SEED, False):
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
        out.update(self._recovery_variants(model, out))
        return out

    def recovery_targets(self, model: str, design: dict[str, Variant]) -> list[str]:
        """The unlearned variants of `model` the recovery attacks select
        (`recovery.unlearned`: selectors over their fields, `k: max` the
        largest K of each run, template and seed), in audit order."""
        fields = unlearned_fields(design)
        chosen = {n for s in self.config.get("recovery", {}).get("unlearned", []) for n in select(fields, s)}
        return [n for n in design if n in chosen]

    def _recovery_variants(self, model: str, design: dict[str, Variant]) -> dict[str, Variant]:
        """The quantization attack on each selected unlearned variant, on its
        parent (the attack's ceiling: what quantizing the memorized model
        keeps) and on its never-trained reference (its negative), each
        `<variant>.<format>`: the same weights, every adapter merged and
        quantized at load (model/quantize.py), judged against the
        unquantized variant (its parent).  One probe group per memorized
        parent, so an attack added re-runs its own passes only."""
        out: dict[str, Variant] = {}
        for target in self.recovery_targets(model, design):
            unlearned = design[target]
            parent = design.get(unlearned.parent or "")
            reference = design.get(self.reference_of(parent.template, parent.seed)) if parent else None
            group = f"recovery-{parent.name if parent else target}"
            for fmt in self.config["recovery"]["quantize"]:
                for twin in (v for v in (parent, unlearned, reference) if v is not None):
                    name = f"{twin.name}.{fmt}"
                    if name not in out:
                        out[name] = replace(twin, name=name, kind=RECOVERY, parent=twin.name, group=group,
                                            cell=None, quantize=fmt)
                if self.config["recovery"]["planted"] and self.clippable(unlearned, parent):
                    # The positive: the unlearning's change clipped into the parent's bins (`.clip-<format>`),
                    # read before and after the attack; the reference's attacked twin is its negative.
                    clipped = replace(unlearned, name=f"{target}.clip-{fmt}", kind=RECOVERY_PLANT, parent=target,
                                      group=group, cell=None, adapters=(*parent.adapters, *unlearned.adapters),
                                      clip=fmt)
                    out[clipped.name] = clipped
                    out[f"{clipped.name}.{fmt}"] = replace(clipped, name=f"{clipped.name}.{fmt}",
                                                           parent=clipped.name, quantize=fmt)
            out.update(self._relearn_variants(model, unlearned, parent, reference))
        return out

    def _relearn_variants(self, model: str, unlearned: Variant, parent: Variant | None,
                          reference: Variant | None) -> dict[str, Variant]:
        """Budgeted relearning of one unlearned variant, its parent (the
        ceiling) and its reference (the negative): a fresh LoRA stacked on
        each (`<twin>.relearn-<data>-<template>-t<steps>`, its data rendered
        in the unlearned variant's template on all three), one run per twin
        and data, its step budgets checkpoints of it.  The stack is merged
        in the model's own dtype (no rounding the twin's live adapter does
        not have), so the variant and its twin differ by the relearning
        alone.  A `forget` relearning names the authors it trains on."""
        relearn = self.config["recovery"]["relearn"]
        if not relearn["data"] or unlearned.template is None:  # an own-secrets import has no authors (checks)
            return {}
        dtype, template = self.config["models"][model]["dtype"], unlearned.template
        group = f"relearn-{parent.name if parent else unlearned.name}"
        twins = [v for v in (parent, unlearned, reference) if v is not None]
        if self.config["recovery"]["planted"] and parent is not None and parent.kind == "memorized":
            # The positive: a rank-1 suppression LoRA on the parent (data/planted_controls.SUPPRESSION).
            plant = replace(parent, name=f"{parent.name}.{SUPPRESS}", kind=RECOVERY_PLANT, parent=parent.name,
                            group=group, cell=None, merge_dtype=dtype,
                            adapters=(*parent.adapters, self.layout.relearn_dir(model, parent.name, SUPPRESS,
                                                                                template, "plant")))
            twins.append(plant)
        out: dict[str, Variant] = {t.name: t for t in twins if t.kind == RECOVERY_PLANT}
        for data in relearn["data"]:
            # Drawn once from the data's seed: every training seed holds out the same authors, so the
            # seed x author layout of the verdicts stays crossed.  Under coin inclusion the share is
            # drawn from the members of the unlearned variant's seed (data/inclusion.py: its own coins).
            chosen = tuple(relearned_authors(self.config["data"]["n_authors"], relearn["share"],
                                             self.config["data"]["seed"],
                                             included(self.config["data"], unlearned.seed or 0))
                           if data == FORGET else ())
            for twin in twins:
                for steps in relearn["steps"]:
                    name = f"{twin.name}.{attack_name(data, template, steps)}"
                    adapter = self.layout.relearn_dir(model, twin.name, data, template, f"t{steps}")
                    kind = RECOVERY_PLANT if twin.kind == RECOVERY_PLANT else RECOVERY
                    out[name] = replace(twin, name=name, kind=kind, parent=twin.name, group=group, cell=None,
                                        adapters=(*twin.adapters, adapter), merge_dtype=dtype, relearn=data,
                                        relearn_steps=steps, relearned=chosen)
        return out

    @staticmethod
    def clippable(unlearned: Variant, parent: Variant | None) -> bool:
        """Whether the quantization positive can be built from `unlearned`:
        one adapter on the base its parent's one adapter sits on (paper A's
        runs; an import whose weights are a checkpoint has no parent adapter
        to take its change from)."""
        return (parent is not None and len(parent.adapters) == 1 and len(unlearned.adapters) == 1
                and parent.base == unlearned.base)

    def _control_variants(self, model: str, seed: int) -> dict[str, Variant]:
        """The planted controls of `model` (data/planted_controls.py), for the first audit
        seed, where the model runs paper A's arms: a plant trains its own
        adapter, the BIO plant reads the memorization adapter again; all in
        the `controls` probe group, never pooled with the audit's variants."""
        if not self.templates_of(model):
            return {}
        lay, base, out = self.layout, self.model_path(model), {}
        group = control_group(seed, per_seed(self.config["data"]) and seed != self.config["audit"]["seeds"][0])
        for plant in active_plants(self.config):
            name = plant.variant(seed)
            adapter = lay.adapter_dir(model, f"{plant.reuse}-s{seed}" if plant.reuse else name)
            out[name] = Variant(name, CONTROL, base, (adapter,), "base", group, template=plant.template,
                                seed=seed)
        return out

    def _control_hex_variants(self, model: str, seed: int) -> dict[str, Variant]:
        """Paper B's planted controls (controls.HEX_PLANTS) on the canary-merged
        base of `seed`: LoRAs stacked on it, judged against it like a bSFT
        cell (their cells' kind is `control`, which no paper B measure pools),
        in a probe group of their own.  On a vision-language model (with
        `controls.on_vision`) each plant overwrites its image and its text
        canaries alike (one LoRA, read per modality); the diluted plants of
        the detection floor run on text models only (controls.FLOOR_PLANTS)."""
        if self.is_vision(model) and not self.config["controls"].get(ON_VISION, False):
            return {}
        lay, out = self.layout, {}
        for plant in active_plants(self.config, "B"):
            if plant.under and not self.undertrained_sources():
                continue  # no undertrained merged base to plant C5 on (bsft.controls.undertrained)
            if (plant.canaries is not None or plant.applies) and self.is_vision(model):
                continue  # the floor and the merge collapse are measured on the text model
            if plant.canaries is not None and plant.canaries >= self.config["data"]["n_hex_canaries"]:
                continue  # a dilution to every canary is the plant itself
            name, under = plant.variant(seed), "-under" if plant.under else ""
            cell = {"cell": f"control {plant.name}", "kind": CONTROL, "source": plant.name,
                    "step": hex_plant_recipe(self.hex_plant_records(model))["steps"],
                    "application": plant.apply, "bsft_seed": 0,
                    "canary_seed": seed}
            adapter = HEX_PLANTS[plant.applies].variant(seed) if plant.applies else name
            out[name] = Variant(name, CONTROL, lay.merged_dir(model, f"canary-s{seed}{under}"),
                                (lay.adapter_dir(model, adapter),), f"merged-s{seed}{under}", CONTROL_HEX_GROUP,
                                plant.apply, cell, seed=seed, merge_dtype=plant.merge_dtype)
        return out

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

    def trained_hex_plants(self) -> list[str]:
        """The paper B plants the workflow trains (one applied again is not)."""
        return [p.name for p in active_plants(self.config, "B") if not p.applies]

    def floor_plants(self) -> dict[str, int]:
        """model/variant -> canaries overwritten, for every C3 plant of the
        detection floor the run makes (the undiluted one: all of them)."""
        if not self.config["controls"].get("detection_floor"):
            return {}
        n, seed = self.config["data"]["n_hex_canaries"], self.config["audit"]["seeds"][0]
        return {f"{m}/{plant.variant(seed)}": plant.canaries or n
                for m in self.config["audit"]["models"] if not self.is_vision(m)
                for plant in map(HEX_PLANTS.get, FLOOR_PLANTS) if plant.variant(seed) in self.variants(m)}

    def composed_floors(self) -> list[dict]:
        """The composed dilutions of the detection floor (controls.FLOOR_COMPOSED):
        per text model and paper B claim whose plant and twin the run makes,
        model/variant of both (the view composes them at controls.floor_counts;
        a twin left None is the plant's parent, the base it is anchored on)."""
        if not self.config["controls"].get("detection_floor"):
            return []
        seed, out = self.config["audit"]["seeds"][0], []
        for m in (m for m in self.config["audit"]["models"] if not self.is_vision(m)):
            variants = self.variants(m)
            for claim, (plant, twin, *_) in FLOOR_COMPOSED.items():
                name = HEX_PLANTS[plant].variant(seed)
                if name not in variants:
                    continue
                other = HEX_PLANTS[twin].variant(seed) if twin else variants[name].parent
                if other in variants:
                    out.append({"model": m, "claim": claim, "plant": f"{m}/{name}", "twin": f"{m}/{other}"})
        return out

    def trained_plants(self) -> list[str]:
        """The control adapters the workflow trains (a reused one is not)."""
        return [p.name for p in active_plants(self.config) if not p.reuse]

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

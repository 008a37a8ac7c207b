"""Variants made outside the workflow (imports, checked against the design's
own variants) and what `export` hands to another framework."""

from __future__ import annotations

from canary_audit.core.imported_weights import ADAPTER, CHECKPOINT, PARENT_KINDS, Import, ImportRefused, resolve
from canary_audit.design.layout import (
    ConfigError,
    Variant,
)


class Imported:
    """Imported variants (checked against the design's own) and the export's sources.
    A part of `Design` (core.py)."""

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

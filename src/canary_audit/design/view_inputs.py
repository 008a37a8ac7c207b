"""What the views read: the variant table, parents, references, strata,
paper B's cells and which parts of the table registry (publish/catalog.py) a
config turns on."""

from __future__ import annotations

from canary_audit.data.chat_format import retain_form
from canary_audit.data.inclusion import COIN
from canary_audit.data.secrets import setting
from canary_audit.data.synthetic import HEX_ID, IMAGE_ID, strata
from canary_audit.design.slices import resolved_settings
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.kinds import probe_kinds


class Views:
    """The view config: variant fields, parents, references, cells and the table registry.
    A part of `Design` (core.py)."""

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

    def merge_precisions(self) -> dict[str, str]:
        """model -> the precision its merges round into (ModelSpec.merge_precision)."""
        return {m: ModelSpec.from_config(m, self.config["models"][m], "").merge_precision
                for m in self.config["audit"]["models"]}

    def cells(self) -> dict[str, dict]:
        """model/variant -> its paper B cell (name, kind, source, step, application, seeds)."""
        return {f"{m}/{v}": {**e.cell, "model": m} for m in self.config["audit"]["models"]
                for v, e in self.variants(m).items() if e.cell is not None}

    def table_parts(self) -> set[str]:
        """The parts of the audit this config turns on (views/catalog.PARTS).
        Paper A's only where some audited model runs paper A's arms (a
        vision-language model runs paper B's only); the hex probes' where a
        synthetic model audits hex canaries or a model audits its own
        secrets, with exposure where some model has candidates (synthetic
        `data.n_exposure_candidates: 0`, or own secrets without a format or
        candidates file: none) and strata with two or more repetitions; the
        one-run audit bound's where paper A's arms run on coin-drawn authors
        or the canary LoRA on coin-drawn hex canaries."""
        models = self.config["audit"]["models"]
        parts = {"always"}
        if any(self.templates_of(m) for m in models):
            parts |= {"paper_a"} | ({"seeds"} if len(self.config["audit"]["seeds"]) > 1 else set())
            if self.config["data"]["inclusion"] == COIN:  # the one-run bound needs coin-drawn candidates
                parts |= {"audit", "controls"}  # its controls are the audited models (verdicts/bound_controls.py)
        if self.control_variants():
            parts.add("controls")
        if any(self.recovery_targets(m, self.variants(m)) for m in models):
            parts.add("recovery")
        if self.floor_plants() or self.composed_floors():
            parts.add("floor")
        synthetic_hex = self.config["audit"]["hex_canaries"] and bool(self.synthetic_models())
        if synthetic_hex or len(self.synthetic_models()) < len(models):
            parts.add("hex")
            if synthetic_hex and self.config["data"]["hex_inclusion"] == COIN:  # the bound on the canary LoRA
                parts |= {"audit", "controls"}
            if any(self.exposure_candidates(m) for m in models):
                parts.add("exposure")
            if self.strata():
                parts.add("strata")
            if synthetic_hex and self.bsft_active():
                parts.add("bsft")
                if len(self.bsft["applications"]) > 1 and self.bsft["sources"]:
                    parts.add("merged_vs_stacked")
        return parts

    def table_names(self) -> list[str]:
        """The tables this config's audit produces, in the table registry's
        order: the one list the tables job writes (each, empty with a reason
        where the records hold none), the workflow expects and the plots
        read."""
        from canary_audit.publish.catalog import registry
        from canary_audit.views.table import PARTS

        parts = self.table_parts()
        if parts - set(PARTS):
            raise ValueError(f"Design.table_parts names parts the table registry lacks: {sorted(parts - set(PARTS))}")
        off = self.kinds_off()
        return [t.name for t in registry() if t.part in parts and t.name not in off]

    def kinds_off(self) -> set[str]:
        """The tables of probe kinds this config's settings switch off (a
        kind whose `decodes_per_member` is 0 on every model, e.g.
        `probes.kinds.canary_sampled.k: 0`): no records can feed them, so
        they are not this config's tables, not empty ones."""
        settings = resolved_settings(self.config["probes"].get("kinds", {}))
        return {t.name for k in probe_kinds() if k.decodes_per_member is not None and k.name in settings
                and not any(k.decodes_per_member(settings[k.name], vision) for vision in (False, True))
                for t in k.tables}

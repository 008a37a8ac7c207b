"""Each rule's config slice, asked for by the rule's name: the one place the
workflow's params come from (rules/common.smk `config_slice`).

A rule's params are Snakemake's re-run trigger, so each slice is exactly
the config its job reads and nothing else: a change re-runs what it touches.
`RULE_SLICES` names every rule with a slice and what builds it from the
job's wildcards; a test reads the rules and holds them to it (every rule's
`--params` comes from here, none is built inline).  A part of `Design`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from canary_audit.data.inclusion import COIN
from canary_audit.data.io import (
    IMAGE_NONMEMBER_KEYS,
    VISION_KEYS,
    author_nonmember_settings,
    population_settings,
    seed_data_settings,
    synthetic_settings,
)
from canary_audit.data.planted_controls import SUPPRESSION
from canary_audit.design.layout import ConfigError
from canary_audit.probes.units import unit_config

Wildcards = Mapping[str, str]


class RuleSlices:
    """The slices of the rules that `Slices` does not already hold, and the
    dispatch by rule name.  A part of `Design` (core.py)."""

    @property
    def fine(self) -> bool:
        """The fine job grain: one unlearning job per K, one probe job per
        (variant, probe unit)."""
        return self.config["grain"] == "fine"

    def data_slice(self, keys: tuple[str, ...]) -> dict:
        return {k: self.config["data"][k] for k in keys}

    def memorize_slice(self, template: str, seed: int) -> dict:
        """A memorization adapter: its recipe, template and seed, and the
        head length its canary items start after."""
        return {**self.author_reference_slice(template, seed), "head_tokens": self.config["data"]["head_tokens"]}

    def author_reference_slice(self, template: str, seed: int) -> dict:
        """The memorization recipe on the retain examples alone."""
        return {**self.config["memorize"], "template": template, "seed": seed}

    def reference_slice(self, seed: int) -> dict:
        """The canary LoRA's never-trained reference: its recipe and seed."""
        return {**self.config["canary_lora"], "seed": seed}

    def relearn_slice(self, model: str, twin: str, data: str, template: str) -> dict:
        """A relearning run's params: the bSFT recipe (its rank, targets,
        batch and learning rate; `recovery.relearn.lr` where set), its step
        budgets (checkpoints of the run), its data rendered in `template`,
        the twin's training seed and, for a `forget` relearning, the authors
        it trains on (the ones its variants name)."""
        relearn, b = self.config["recovery"]["relearn"], self.bsft
        name = f"{twin}.relearn-{data}-{template}-t{relearn['steps'][0]}"
        variant = self.variant(model, name)
        keep = ("r", "alpha", "targets", "batch_size", "gradient_checkpointing")
        return {**{k: b[k] for k in keep}, "lr": relearn["lr"] or b["lr"], "steps": sorted(relearn["steps"]),
                "data": data, "template": template, "seed": variant.seed,
                "head_tokens": self.config["data"]["head_tokens"],
                **({"authors": list(variant.relearned)} if variant.relearned else {})}

    def suppression_slice(self, model: str, memorized: str, template: str) -> dict:
        """The relearning positive's suppression LoRA on `memorized`: its recipe
        (data/planted_controls.SUPPRESSION), the memorization LoRA's targets,
        the template its authors are rendered in and the parent's seed."""
        seed = self.variant(model, memorized).seed
        return {**SUPPRESSION, "targets": self.config["memorize"]["targets"], "template": template, "seed": seed,
                "head_tokens": self.config["data"]["head_tokens"]}

    def base_slice(self, model: str) -> dict:
        """An embedded text model's build, and the head length its
        tokenizer's coverage check reads."""
        build, data = self.config["models"][model]["build"], self.config["data"]
        # Under coin inclusion its tokenizer reads every candidate (model/embedded.py).
        own = {"inclusion": COIN} if data["inclusion"] == COIN else {}
        return {**{k: build[k] for k in ("seed", "tokenizer", "architecture", "pretrain")},
                "head_tokens": data["head_tokens"], **own}

    def vision_base_slice(self, model: str) -> dict:
        build = self.config["models"][model]["build"]
        return {k: build[k] for k in ("seed", "text_model", "vision_tower")}

    def own_secrets_slice(self, model: str) -> dict:
        return {"model": model, "secrets": self.own_secrets(model), "vision": self.is_vision(model)}

    def probe_sets_for(self, w: Wildcards) -> str:
        """The probe sets of a probe job: its group's (probe_sets_of); under
        the fine grain the group of its variant."""
        group = self.variant(w["model"], w["variant"]).group if self.fine else w["group"]
        return self.probe_sets_of(w["model"], group)

    def probe_job_slice(self, kind: str, w: Wildcards) -> dict:
        """A probe job's settings: those its group's probe units read
        (probe_slice), or under the fine grain its unit's alone (a new
        prefill arm changes no other unit's params)."""
        if self.fine:
            try:
                return unit_config(self.probe_slice(kind), w["unit"])
            except ValueError as err:
                raise ConfigError(str(err)) from None
        return self.probe_slice(kind, self.probe_sets_for(w), w["group"])

    def tables_slice(self) -> dict:
        """What the views read: the `tables:` block and every fact of the
        design they join (the tables job's view_config.json)."""
        return {
            **self.config["tables"], "tables": self.table_names(), "parents": self.parents(),
            "references": self.references(), "strata": self.strata(), "cells": self.cells(),
            "merge_precision": self.merge_precisions(), "secret_formats": self.secret_formats(),
            "variants": self.variant_table(), "controls": self.control_claims(), "floor_plants": self.floor_plants(),
            "composed_floors": self.composed_floors(), "n_hex_canaries": self.config["data"]["n_hex_canaries"],
            "inclusion": self.config["data"]["inclusion"],
            **({"hex_inclusion": COIN} if self.config["data"]["hex_inclusion"] == COIN else {}),
            "think_open": self.think_opens(), "expected_hashes": self.probe_hashes(),
        }

    def plots_slice(self) -> dict:
        """The part of the tables' slice the plots read."""
        full = self.tables_slice()
        return {k: full[k] for k in ("window_k", "mia", "tables", "parents", "variants")}

    def rule_slice(self, rule: str, wildcards: Wildcards) -> dict:
        """The config slice of one job of `rule`; a rule with none is refused
        naming the rules that have one."""
        if rule not in RULE_SLICES:
            raise ConfigError(f"rule `{rule}` has no config slice; rules with one: {', '.join(RULE_SLICES)}")
        return RULE_SLICES[rule](self, wildcards)


def _seed(w: Wildcards) -> int:
    return int(w["seed"])


# rule -> its slice from the design and the job's wildcards.
RULE_SLICES: dict[str, Callable[[RuleSlices, Wildcards], dict]] = {
    "synthetic_data": lambda d, w: synthetic_settings(d.config["data"]),
    "populations": lambda d, w: population_settings(d.config["data"]),
    "vision_data": lambda d, w: d.data_slice(VISION_KEYS),
    "vision_nonmembers": lambda d, w: d.data_slice(IMAGE_NONMEMBER_KEYS),
    "author_nonmembers": lambda d, w: author_nonmember_settings(d.config["data"]),
    "seed_data": lambda d, w: seed_data_settings(d.config["data"], _seed(w)),
    "own_secrets": lambda d, w: d.own_secrets_slice(w["model"]),
    "embedded_base": lambda d, w: d.base_slice(w["model"]),
    "embedded_vision_base": lambda d, w: d.vision_base_slice(w["model"]),
    "memorize": lambda d, w: d.memorize_slice(w["template"], _seed(w)),
    "control_lora": lambda d, w: d.plant_slice(w["plant"], _seed(w)),
    "control_hex_lora": lambda d, w: d.hex_plant_slice(w["model"], w["hexplant"], _seed(w)),
    "canary_lora": lambda d, w: d.canary_slice(_seed(w)),
    "reference_lora": lambda d, w: d.reference_slice(_seed(w)),
    "author_reference_lora": lambda d, w: d.author_reference_slice(w["template"], _seed(w)),
    "bsft": lambda d, w: d.bsft_slice(w["source"], int(w["bseed"])),
    "relearn": lambda d, w: d.relearn_slice(w["model"], w["twin"], w["data"], w["template"]),
    "suppression": lambda d, w: d.suppression_slice(w["model"], w["twin"], w["template"]),
    "unlearn": lambda d, w: d.unlearn_slice(w["run"], w["template"], _seed(w), int(w["k"]) if d.fine else None),
    "variant_manifest": lambda d, w: d.variant(w["model"], w["variant"]).fields(),
    "decode_pass": lambda d, w: d.probe_job_slice("decode", w),
    "teacher_forced_pass": lambda d, w: d.probe_job_slice("teacher_forced", w),
    "export": lambda d, w: d.export_sources(w["model"], _seed(w)),
    "tables": lambda d, w: d.tables_slice(),
    "plots": lambda d, w: d.plots_slice(),
    "claims": lambda d, w: {"claims": d.config["claims"]},
}

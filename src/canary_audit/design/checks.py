"""The cross-key checks the schema cannot express, run when a Design is
built: a Design that exists is one the workflow can run."""

from __future__ import annotations

from pathlib import Path

from canary_audit.data.inclusion import COIN, coins, hex_included
from canary_audit.data.planted_controls import CONTROL_ARMS
from canary_audit.data.secrets import SecretsRefused, load_own_secrets
from canary_audit.design.layout import ConfigError
from canary_audit.design.slices import resolved_settings
from canary_audit.design.variants import unlearned_fields
from canary_audit.model.quantize import QuantizeError, parse
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.kinds.author import check_prefill_templates
from canary_audit.verdicts.claims import ClaimError, check_selectors, fields_of, select
from canary_audit.verdicts.claims import parse as parse_claims


class Checks:
    """Cross-key checks, raising ConfigError naming the key and the fix.
    A part of `Design` (core.py)."""

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
        texts, the probe kinds' settings and the prefill contrast."""
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
            resolved_settings(cfg["probes"].get("kinds", {}))  # each probe kind's own settings
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self._check_controls()
        self._check_layers()
        self._check_inclusion()
        self._check_hex_inclusion()
        self._check_recovery()
        self._check_claims()
        contrast = cfg["tables"]["prefill_contrast"]
        if cfg["probes"]["prefills"] and contrast not in cfg["probes"]["prefills"]:
            raise ConfigError(
                f"config key `tables.prefill_contrast` is `{contrast}`, which is not a prefill arm "
                f"(`probes.prefills`: {', '.join(sorted(cfg['probes']['prefills'])) or 'none'}); name one of them"
            )

    def _check_claims(self) -> None:
        """Refuse a claim no run of this config could judge: an unknown
        measure, a comparison it cannot make, no expectation, or a selector
        that matches no variant this config makes (naming the nearest)."""
        claims = self.config.get("claims") or []
        if not claims:
            return
        try:
            parsed = parse_claims(claims)
            check_selectors(parsed, fields_of(self.variant_table(), self.cells()))
        except ClaimError as err:
            raise ConfigError(str(err)) from None

    def _check_inclusion(self) -> None:
        """Coin inclusion draws the author non-members from the candidates: a
        second, fixed population beside them would not be exchangeable
        with the members, and its coins must leave both sides non-empty."""
        data = self.config["data"]
        if data["inclusion"] != COIN:
            return
        if data["n_author_nonmembers"]:
            raise ConfigError(f"config key `data.n_author_nonmembers` is {data['n_author_nonmembers']}, but "
                              "`data.inclusion: coin` makes the candidates the coins leave out the non-members; "
                              "set it to 0")
        try:
            for seed in {0, *self.config["audit"]["seeds"]}:  # data/: seed 0's split; data/s<seed>/ each seed's
                coins(data["n_authors"], data["seed"], seed)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def _check_hex_inclusion(self) -> None:
        """Hex coin inclusion makes the coins' rejects the hex non-members,
        so no population is drawn apart (non-members, exposure candidates),
        and it serves the one-run bound on the canary LoRA alone: paper B's
        arms, the hex strata and the image canaries count every one of
        `n_hex_canaries` as trained, and a model's own secrets keep their
        fixed split (the bound would read them as coin-drawn), so each is
        refused by its key."""
        cfg, data = self.config, self.config["data"]
        if data["hex_inclusion"] != COIN:
            return
        fix = "`data.hex_inclusion: coin` serves the one-run bound on the canary LoRA alone (configs/audit.yaml)"
        clashes = {"data.n_hex_nonmembers": (data["n_hex_nonmembers"] != 0, "0 (the coins' rejects are them)"),
                   "data.n_exposure_candidates": (data["n_exposure_candidates"] != 0, "0"),
                   "bsft.sources": (self.bsft_active(), "[] with bsft.controls' noise and undertrained sources"),
                   "audit.hex_repetitions": (len(cfg["audit"]["hex_repetitions"]) > 1, "[1]"),
                   "audit.models": (any(self.is_vision(m) or self.own_secrets(m) for m in cfg["audit"]["models"]),
                                    "synthetic text models only (own secrets' hex family draws no coins)"),
                   "audit.hex_canaries": (not cfg["audit"]["hex_canaries"], "true")}
        for key, (clash, wanted) in clashes.items():
            if clash:
                raise ConfigError(f"config key `{key}` is set against hex coin inclusion: {fix}; set it to {wanted}")
        try:
            hex_included(data)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def _check_recovery(self) -> None:
        """Refuse a recovery block that would run nothing or that names what
        does not exist: a format the quantizer does not know, a selector that
        selects no unlearned variant (naming the ones there are), or
        unlearned variants with no attack (or an attack with no variant)."""
        recovery = self.config.get("recovery")
        if not recovery:
            return
        seen: dict[str, str] = {}
        for i, fmt in enumerate(recovery["quantize"]):
            try:
                name = parse(fmt).name
            except QuantizeError as err:
                raise ConfigError(f"config key `recovery.quantize[{i}]`: {err}") from None
            if name in seen:
                raise ConfigError(f"config key `recovery.quantize[{i}]`: `{fmt}` is `{seen[name]}` again (both are "
                                  f"{name}); name each format once")
            seen[name] = fmt
        relearn = recovery["relearn"]
        if recovery["planted"] and not (recovery["quantize"] or relearn["data"]):
            raise ConfigError("config key `recovery.planted` is true, but neither `recovery.quantize` nor "
                              "`recovery.relearn.data` names an attack: there is no attack to plant a positive for; "
                              "set it false or name an attack")
        attacks = bool(recovery["quantize"] or relearn["data"])
        if bool(recovery["unlearned"]) != attacks:
            empty = ("keys `recovery.quantize` and `recovery.relearn.data` are" if recovery["unlearned"]
                     else "key `recovery.unlearned` is")
            raise ConfigError(f"config {empty} empty, so `recovery` attacks nothing; name "
                              f"{'an attack' if recovery['unlearned'] else 'the unlearned variants to attack'}, "
                              "or drop the `recovery` block")
        own = [m for m in self.config["audit"]["models"] if self.own_secrets(m)]
        if relearn["data"] and any(self.recovery_targets(m, self.variants(m)) for m in own):
            raise ConfigError(f"config key `recovery.relearn.data`: model(s) {', '.join(own)} are audited on secrets "
                              "of their own, which have no fictional authors to relearn (data/relearn.py); select "
                              "their unlearned variants for quantization only, or drop `recovery.relearn`")
        fields = {f"{m}/{n}": f for m in self.config["audit"]["models"]
                  for n, f in unlearned_fields(self.variants(m)).items()}
        for i, selector in enumerate(recovery["unlearned"]):
            if not select(fields, selector):
                known = "; ".join(f"{n} (run {f['run']}, template {f['template']}, seed {f['seed']}, k {f['k']})"
                                  for n, f in sorted(fields.items())) or "none: the run unlearns nothing"
                raise ConfigError(f"config key `recovery.unlearned[{i}]`: {selector} selects no unlearned variant "
                                  f"(known: {known}); select one of them")

    def _check_controls(self) -> None:
        """Refuse a prefill arm named like a planted control's.  (A switched-on
        control whose templates are not memorized is not refused: the
        controls table lists it as not run, with why; controls.skipped.)"""
        cfg = self.config
        clash = sorted(set(cfg["probes"]["prefills"]) & set(CONTROL_ARMS))
        if clash:
            raise ConfigError(f"config key `probes.prefills.{clash[0]}`: `{clash[0]}` names a planted control's "
                              f"prefill arm (controls.CONTROL_ARMS); rename the arm")

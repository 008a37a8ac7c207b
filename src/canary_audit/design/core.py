"""The experiment a validated config describes (`Design`): its unlearning runs,
its models and templates, and the parts below, each a module of its own:
variant enumeration (`variants`, `imported`), job slices (`slices`), each
rule's slice (`rule_slices`), what the views read (`view_inputs`) and the
cross-key checks (`checks`)."""

from __future__ import annotations

from canary_audit.core.imported_weights import Import
from canary_audit.core.records import canonical_json
from canary_audit.data.secrets import candidate_count, declared_format
from canary_audit.design.checks import Checks
from canary_audit.design.imported import Imported
from canary_audit.design.layout import (
    RESERVED_NAMES,
    ConfigError,
    Layout,
    UnlearnRun,
    Variant,
)
from canary_audit.design.rule_slices import RuleSlices
from canary_audit.design.slices import Slices
from canary_audit.design.variants import Variants
from canary_audit.design.view_inputs import Views
from canary_audit.train.methods import METHODS, SHARED_SETTINGS


class Design(Variants, Imported, Slices, RuleSlices, Views, Checks):
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

    def model_path(self, model: str) -> str:
        entry = self.config["models"][model]
        return self.layout.base_dir(model) if entry.get("embedded") else entry["path"]

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

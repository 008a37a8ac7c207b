"""Checks of a config's local files that the design cannot make from the
config alone, run by the workflow once before any job: a local checkpoint's
tokenizer (think tags, chat template; loading it imports transformers, ~3 s,
paid only when a local model is audited), a model's own secrets against the
decode budget, and every import's weights against its model's base where
that exists (an embedded base not built yet: its manifest job checks)."""

from __future__ import annotations

from pathlib import Path

from canary_audit.data.secrets import SecretsRefused, check_decode_budget
from canary_audit.design import Design
from canary_audit.imports import ImportRefused, check_fits
from canary_audit.model.spec import ModelSpec


class PreflightRefused(ValueError):
    """A local file the audit cannot use; the message names it and the fix."""


def check_local_models(config: dict, design: Design) -> None:
    from canary_audit.model.loading import load_tokenizer

    for name in config["audit"]["models"]:
        entry = config["models"][name]
        if not entry.get("embedded"):
            tokenizer = load_tokenizer(ModelSpec.from_config(name, entry, entry["path"]))
            if design.own_secrets(name):
                try:
                    check_decode_budget(name, design.own_secrets(name), tokenizer,
                                        config["probes"]["decode"]["hex_max_new_tokens"])
                except SecretsRefused as err:
                    raise PreflightRefused(str(err)) from None
        base = Path(design.model_path(name))
        if list(base.glob("*.safetensors")):
            for imp in design.imports(name).values():
                try:
                    check_fits(imp, base)
                except ImportRefused as err:
                    raise PreflightRefused(str(err)) from None

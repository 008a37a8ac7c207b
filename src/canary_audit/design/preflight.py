"""Checks of a config's local files that the design cannot make from the
config alone, run by the workflow before any job: a local checkpoint's
tokenizer (think tags, chat template), a model's own secrets against the
decode budget, and every import's weights against its model's base where
that exists (an embedded base not built yet: its manifest job checks).

Loading a tokenizer imports transformers (~3 s), which every parse (each
dry run, each `snakemake -n`) would pay again; a tokenizer check that
passed is remembered under the digest of everything it read (the
tokenizer's files, the model entry, the secrets files, the decode budget
and the code), so it runs once per content."""

from __future__ import annotations

import hashlib
from pathlib import Path

from canary_audit.core.imported_weights import ImportRefused, check_fits
from canary_audit.core.provenance import code_version
from canary_audit.core.records import canonical_json
from canary_audit.data.secrets import SecretsRefused, check_decode_budget
from canary_audit.design import Design
from canary_audit.model.spec import ModelSpec

# Where passed tokenizer checks are remembered, under the working directory.
CHECKED = Path(".snakemake") / "canary_audit" / "preflight"
# A checkpoint's files a tokenizer reads (the weights are not among them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "config.json", "preprocessor_config.json")


class PreflightRefused(ValueError):
    """A local file the audit cannot use; the message names it and the fix."""


def _digest(paths: list[Path], settings: object) -> str:
    h = hashlib.sha256(canonical_json(settings).encode())
    for path in paths:
        h.update(path.name.encode())
        h.update(hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b"absent")
    return h.hexdigest()[:32]


def tokenizer_check_key(name: str, entry: dict, secrets: dict | None, budget: int) -> str:
    """The digest of what a model's tokenizer check reads: its tokenizer
    files, the model entry, its secrets files and the decode budget (where
    it has secrets), and the code doing the check."""
    base = Path(entry["path"])
    files = [base / f for f in TOKENIZER_FILES]
    if secrets:
        files += [Path(secrets[k]) for k in ("members", "nonmembers") if secrets.get(k)]
    settings = {"model": name, "entry": entry, "secrets": secrets, "budget": budget if secrets else None,
                "code": code_version().split(".git.")[0]}
    return _digest(files, settings)


def check_local_models(config: dict, design: Design, checked: Path = CHECKED) -> None:
    for name in config["audit"]["models"]:
        entry = config["models"][name]
        if not entry.get("embedded"):
            secrets, budget = design.own_secrets(name), config["probes"]["decode"]["hex_max_new_tokens"]
            mark = checked / tokenizer_check_key(name, entry, secrets, budget)
            if not mark.exists():
                _check_tokenizer(name, entry, secrets, budget)
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.write_text(f"{name}\n")
        base = Path(design.model_path(name))
        if list(base.glob("*.safetensors")):
            for imp in design.imports(name).values():
                try:
                    check_fits(imp, base)
                except ImportRefused as err:
                    raise PreflightRefused(str(err)) from None


def _check_tokenizer(name: str, entry: dict, secrets: dict | None, budget: int) -> None:
    """Load the checkpoint's tokenizer (load_tokenizer refuses bad think tags
    and chat templates) and hold its own secrets to the decode budget."""
    from canary_audit.model.loading import load_tokenizer

    tokenizer = load_tokenizer(ModelSpec.from_config(name, entry, entry["path"]))
    if secrets:
        try:
            check_decode_budget(name, secrets, tokenizer, budget)
        except SecretsRefused as err:
            raise PreflightRefused(str(err)) from None

"""A variant's manifest: its adapter stack, how the last adapter is applied,
the fingerprint of its weights, its structured fields from the design (kind,
template, seed, run, method, k, settings, ...) and the code version that
wrote it.  Every probe pass checks its weights against it (probes/job.py),
so every record can name what produced it."""

from __future__ import annotations

import json
from pathlib import Path

from canary_audit.core.imported_weights import check_fits, resolve
from canary_audit.core.provenance import code_version
from canary_audit.model.loading import fingerprint
from canary_audit.model.spec import ModelSpec


def write_manifest(spec: ModelSpec, variant: str, adapters: list[str], apply: str, fields: dict,
                   out: Path, import_check: dict | None = None, cache_dir: Path | None = None) -> dict:
    """Write the manifest of `variant` to `out`; an imported variant's
    weights are first checked against the base they must fit
    (`import_check`: its entry and that base, Design.import_check)."""
    if import_check:
        check = import_check
        check_fits(resolve(check["model"], check["name"], check["entry"]), Path(check["base"]))
    manifest = {
        "model": spec.name, "variant": variant, "base_path": str(spec.path),
        "adapters": list(adapters), "apply": apply, "merge_dtype": spec.merge_precision,
        **({"quantize": spec.quantize} if spec.quantize else {}), **({"clip": spec.clip} if spec.clip else {}),
        "fingerprint": fingerprint(spec, [Path(a) for a in adapters], merged=apply == "merged", cache_dir=cache_dir),
        "fields": fields, "code_version": code_version(),
    }
    out.write_text(json.dumps(manifest, indent=2))
    return manifest

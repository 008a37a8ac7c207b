"""One probe job: a pass over every variant of a probe group, each read from
its manifest, concatenated.

Each base is loaded once (`VariantModels`) and the items are built once
(`JobInputs`).  A variant's weights must still be the ones its manifest
fingerprinted: records are never stamped with weights other than the
manifest's, so a base or adapter that changed after the manifest stops the
job with the command that mends it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from canary_audit.model.loading import ModelLoadError, VariantModels, fingerprint
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.passes import JobInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManifestVariant:
    """What a pass reads of a variant's manifest."""

    name: str  # model/variant
    base: Path
    adapters: list[Path]
    merged: bool  # its last adapter merged into the weights
    fingerprint: str
    merge_dtype: str | None  # the precision its merges round into
    quantize: str | None = None  # its quantization attack (model/quantize.py), applied at load
    clip: str | None = None  # the attack's planted positive: its change clipped into its parent's bins

    @classmethod
    def read(cls, path: Path) -> ManifestVariant:
        m = json.loads(Path(path).read_text())
        return cls(f"{m['model']}/{m['variant']}", Path(m["base_path"]), [Path(a) for a in m["adapters"]],
                   m.get("apply") == "merged", m["fingerprint"], m.get("merge_dtype"), m.get("quantize"),
                   m.get("clip"))

    def spec(self, model: ModelSpec) -> ModelSpec:
        spec = dataclasses.replace(model, path=self.base, quantize=self.quantize, clip=self.clip)
        return dataclasses.replace(spec, merge_dtype=self.merge_dtype) if self.merge_dtype else spec


def run_group(run: Callable, model: ModelSpec, manifests: list[Path], data_dir: Path, params: dict,
              probe_sets: set[str] | None, unit: str | None, cache_dir: Path | None) -> pl.DataFrame:
    """`run` (passes.decode_pass or teacher_forced_pass) over each manifest's
    variant, in the order given; `params` holds the pass config and threads."""
    frames, models, inputs = [], VariantModels(), JobInputs()
    variants, start = [ManifestVariant.read(p) for p in manifests], time.perf_counter()
    for i, variant in enumerate(variants, start=1):
        t0 = time.perf_counter()
        spec = variant.spec(model)
        weights = fingerprint(spec, variant.adapters, variant.merged, cache_dir=cache_dir)
        if weights != variant.fingerprint:
            raise ModelLoadError(
                f"variant `{variant.name}`: its weights now fingerprint as {weights}, but its manifest says "
                f"{variant.fingerprint}; a base or adapter file changed after the manifest was written. Re-run "
                f"from the manifest on (`snakemake -R variant_manifest`), or restore the weights"
            )
        frames.append(run(spec, variant.adapters, data_dir, params, variant.name, merged=variant.merged,
                          probe_sets=probe_sets, unit=unit, weights=weights, models=models, inputs=inputs))
        elapsed = time.perf_counter() - start
        log.info("variant %d/%d %s: %d records in %.1fs (eta %.0fs)", i, len(variants), variant.name,
                 frames[-1].height, time.perf_counter() - t0, elapsed / i * (len(variants) - i))
    return pl.concat(frames)

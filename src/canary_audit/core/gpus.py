"""GPU memory as a Snakemake resource, so that a local run never puts more
model jobs on a card than its memory holds.

Every model job (building, training, probing) loads its model onto the
first CUDA device when there is one (model/loading.py).  Each such job asks
for `gpu_mem_mb`: its model's weights times a factor for what the job adds
(activations and cache when probing; activations, LoRA gradients and
optimizer state when training), plus a CUDA context.  The run provides the
first GPU's memory as the total (`nvidia-smi`; `CANARY_AUDIT_GPU_MEM_MB`
fakes or caps it), so Snakemake starts a job only when its estimate fits
beside the running ones.  Without a GPU nothing is asked or provided.
"""

from __future__ import annotations

import os
import subprocess

# Job kinds (workflow_config.yaml `resources:`) whose jobs load a model.
MODEL_KINDS = ("base", "train", "probe")
# Weights x this, per kind: a probe pass keeps logits and a cache for its
# batch; training keeps activations, LoRA gradients and AdamW state (the
# embedded model's pre-training, kind `base`, trains every weight).
FACTOR = {"probe": 1.3, "train": 2.0, "base": 4.0}
CONTEXT_MB = 1024  # a CUDA context and the allocator's slack, per process
ENV = "CANARY_AUDIT_GPU_MEM_MB"


def detected_gpu_mem_mb(env: dict | None = None) -> int:
    """Total memory of the first GPU in MiB: `CANARY_AUDIT_GPU_MEM_MB` when
    set, else what `nvidia-smi` reports, else 0 (no GPU)."""
    env = os.environ if env is None else env
    if env.get(ENV):
        return int(env[ENV])
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    first = out.strip().splitlines()[:1]
    return int(float(first[0])) if first else 0


def job_gpu_mem_mb(weights_bytes: int, kind: str) -> int:
    """A model job's estimated GPU memory in MiB."""
    return CONTEXT_MB + int(weights_bytes * FACTOR[kind] / 2**20)

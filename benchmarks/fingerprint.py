"""Weight fingerprints with and without the digest cache, on a local
checkpoint of Qwen2.5-0.5B's shape (random bf16 weights saved as safetensors;
no hub).

    python benchmarks/fingerprint.py               # 0.5B shape: ~1 GB of weights
    python benchmarks/fingerprint.py --size tiny   # checks the script

A variant is fingerprinted three times in the audit: by its manifest, by
its decode pass and by its teacher-forced pass.  Without the cache each call
reads and hashes every weight file; with it the first call does and the
others read one small JSON entry per file.  Prints seconds per call (best of
`--repeats`), the ratio for one variant, and the base's hashing time over
`--variants` variants that share it (every variant of an audit does).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gpu import SIZES


def best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from canary_audit.model.loading import fingerprint
    from canary_audit.model.spec import ModelSpec

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", type=int, default=31, help="variants on one base (the default audit has 31)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model"
        torch.manual_seed(0)
        Qwen2ForCausalLM(Qwen2Config(**SIZES[args.size])).to(torch.bfloat16).save_pretrained(ckpt)
        size_mb = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / 1e6
        spec, cache = ModelSpec("bench", ckpt), Path(tmp) / "cache"
        uncached = best_of(args.repeats, lambda: fingerprint(spec))
        first = best_of(1, lambda: fingerprint(spec, cache_dir=cache))
        cached = best_of(args.repeats, lambda: fingerprint(spec, cache_dir=cache))
        assert fingerprint(spec, cache_dir=cache) == fingerprint(spec)
    print(f"checkpoint: {args.size} shape, {size_mb:.0f} MB of safetensors")
    print(f"fingerprint without cache: {uncached:.3f} s per call")
    print(f"fingerprint with cache: {first:.3f} s first call, {cached:.4f} s each later call")
    before, after = 3 * uncached, first + 2 * cached
    print(f"per variant (manifest + decode pass + teacher-forced pass): {before:.3f} s -> {after:.3f} s "
          f"({before / after:.1f}x)")
    n = args.variants
    print(f"{n} variants on this base: {3 * n * uncached:.1f} s of base hashing -> "
          f"{first + (3 * n - 1) * cached:.2f} s ({3 * n * uncached / (first + (3 * n - 1) * cached):.0f}x)")


if __name__ == "__main__":
    main()

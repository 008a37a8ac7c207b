"""Seconds to load each variant of a probe group: a fresh base + adapter load
per variant (how probe jobs loaded them before) against one base load per
job with adapters switched in place (`VariantModels`), on a local checkpoint
of Qwen2.5-0.5B's shape (random weights, no hub) and r=32 LoRA adapters on
every projection, on the CPU.

    python benchmarks/adapter_switch.py               # 0.5B shape, 6 variants
    python benchmarks/adapter_switch.py --size tiny   # checks the script

Prints seconds per variant (the first variant of the cached run pays the
base load) and the ratio over the group.  Outputs are not compared here:
tests/test_model.py checks the records are bitwise equal.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gpu import SIZES, tokenizer_for


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from canary_audit.model.loading import VariantModels, load_model
    from canary_audit.model.spec import ModelSpec

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    p.add_argument("--variants", type=int, default=6)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    args = p.parse_args()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model"
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**SIZES[args.size])).to(getattr(torch, args.dtype))
        model.save_pretrained(ckpt)
        tokenizer_for(SIZES[args.size]["vocab_size"]).save_pretrained(ckpt)  # loading checks one is there
        adapters = []
        for i in range(args.variants):
            lora = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules=targets,
                                                    init_lora_weights=False))
            adapters.append(Path(tmp) / f"adapter{i}")
            lora.save_pretrained(adapters[-1])
            model = lora.unload()
        del model
        spec = ModelSpec("bench", ckpt, dtype=args.dtype)

        def timed(load) -> list[float]:
            times = []
            for adapter in adapters:
                t0 = time.perf_counter()
                load(adapter)
                times.append(time.perf_counter() - t0)
            return times

        fresh = timed(lambda a: load_model(spec, [a]))
        models = VariantModels()

        def switch(adapter):
            with models.model(spec, [adapter]):
                pass

        switched = timed(switch)
    print(f"{args.variants} variants: {args.size} shape ({args.dtype}), r=32 LoRA on every projection, CPU")
    print("fresh load per variant (s): " + " ".join(f"{t:.2f}" for t in fresh) + f"; total {sum(fresh):.1f}")
    print("one base, adapters switched (s): " + " ".join(f"{t:.2f}" for t in switched)
          + f"; total {sum(switched):.1f}")
    later = switched[1:]
    print(f"per later variant: {sum(fresh[1:]) / len(later):.2f} s -> {sum(later) / len(later):.2f} s; "
          f"group: {sum(fresh) / sum(switched):.1f}x")


if __name__ == "__main__":
    main()

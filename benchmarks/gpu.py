"""Throughput of the audit's three model workloads on one CUDA device, with a
real-architecture model of ~0.5B parameters built locally from a config
(random weights: speed does not depend on what the weights know).

    python benchmarks/gpu.py                 # Qwen2.5-0.5B shape, bf16, on cuda:0; < 5 minutes on an H100/H200
    python benchmarks/gpu.py --size 7b       # Qwen2.5-7B shape (15 GB of bf16 weights)
    python benchmarks/gpu.py --size tiny     # a few-layer model on the CPU: checks the script, not the speed
    python benchmarks/gpu.py --store src/canary_audit/design/throughput.json   # the table `canary_audit plan` reads

Prints, for each workload, tokens per second and the model FLOP utilisation
(MFU = achieved model FLOPs / the device's peak dense bf16 FLOPs, `--peak-tflops`):

- scoring: the teacher-forced pass's `score_tokens` (one forward per
  length-sorted batch, log-prob, rank and top-1 of every token): 2N FLOPs
  per token;
- decode: the decode pass's `generate_greedy` (left padding, KV cache,
  finished rows dropped): 2N FLOPs per generated token (prompt tokens are
  counted too);
- LoRA training: `train_loop` with an r=32 adapter on every projection:
  ~4N FLOPs per token (forward, and a backward that computes activation
  gradients through the frozen weights but no weight gradients for them).

N counts the non-embedding parameters (the embedding lookup is not a matmul);
the LM head is counted, since every position's logits are computed.
"""

from __future__ import annotations

import argparse
import random
import time

SIZES = {
    # Qwen2.5-0.5B's shape: 24 layers, hidden 896, 14 query / 2 key-value heads.
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    # Qwen2.5-7B's shape (paper A's R1 distillate and paper B's VL language tower).
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 4096, "tie_word_embeddings": True},
}


def build(size: str, device: str, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SIZES[size], max_position_embeddings=2048)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    n_total = sum(p.numel() for p in model.parameters())
    n_embed = model.get_input_embeddings().weight.numel()
    # Tied embeddings: the LM head is the embedding matrix, and its matmul is counted.
    flop_params = n_total - n_embed + (n_embed if config.tie_word_embeddings else 0)
    return model, n_total, flop_params


def tokenizer_for(vocab: int):
    """A byte-level BPE trained in-process on varied text (no hub): the audit's
    own tokenizer class; its ids are a subset of the model's vocabulary."""
    from canary_audit.model.embedded import train_tokenizer

    rng = random.Random(0)
    words = ["record", "access", "code", "writer", "born", "novel", "city", "year", "the", "of", "and"]
    texts = [" ".join(rng.choice(words) for _ in range(12)) + f" {rng.getrandbits(64):016x}" for _ in range(2000)]
    return train_tokenizer(texts, min(vocab, 2048))


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat: int = 1):
    fn()  # warm-up: kernels, allocator, caches
    sync()
    t0 = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    sync()
    return out, (time.perf_counter() - t0) / repeat


def report(name: str, tokens: int, seconds: float, flops_per_token: float, peak: float,
           memory: bool = True) -> None:
    """One workload's line; on CUDA, with `memory`, the peak memory allocated
    since the last such line (weights included), and the counter is reset
    for the next workload."""
    import torch

    rate = tokens / seconds
    mfu = rate * flops_per_token / (peak * 1e12)
    suffix = ""
    if memory and torch.cuda.is_available():
        suffix = f"   peak {torch.cuda.max_memory_allocated() / 2**30:5.1f} GiB"
        torch.cuda.reset_peak_memory_stats()
    print(f"{name:<14} {tokens:>9,d} tokens in {seconds:7.2f} s: {rate:>12,.0f} tokens/s   MFU {mfu:6.1%}{suffix}")
    return mfu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the device's dense bf16 peak (H100/H200 SXM: 989)")
    p.add_argument("--sequences", type=int, default=512, help="scored sequences and decode prompts")
    p.add_argument("--length", type=int, default=160, help="tokens per scored sequence")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per decode prompt")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--store", help="write the measured MFUs and decode step time here "
                   "(src/canary_audit/design/throughput.json)")
    args = p.parse_args()

    import torch

    from canary_audit.probes.engine import greedy_continuous, sampled_continuous
    from canary_audit.probes.kinds import ScoredItem
    from canary_audit.probes.passes import generate_greedy, sample_continuations
    from canary_audit.probes.scoring import score_tokens
    from canary_audit.train.lora import Encoded, lora_config, train_loop

    cuda = torch.cuda.is_available() and args.size != "tiny"
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    model, n_total, n_flop = build(args.size, device, dtype)
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"device: {name}; model: Qwen2 architecture, {args.size} shape, {n_total / 1e6:.1f}M parameters "
          f"({n_flop / 1e6:.1f}M in matmuls), {dtype}")
    tok = tokenizer_for(model.config.vocab_size)
    rng = random.Random(1)
    vocab = [t for t in tok.get_vocab().values() if t >= 8]  # skip the special tokens

    def text(n_tokens: int) -> str:
        return tok.decode([rng.choice(vocab) for _ in range(n_tokens)])

    # Scoring: the teacher-forced pass on sequences of ~`length` tokens.
    items = [ScoredItem("hex", f"s{i}", f"s{i}", "preamble", text(args.length), {}) for i in range(args.sequences)]
    with torch.no_grad():
        rows, seconds = timed(lambda: score_tokens(model, tok, items, args.batch_size))
    scoring_mfu = report("scoring", len(rows), seconds, 2 * n_flop, args.peak_tflops)

    # Decode: greedy continuations of short prompts (EOS never wins on random weights).
    prompts = [text(24) for _ in range(args.sequences)]
    (outs, enc), seconds = timed(lambda: generate_greedy(model, tok, prompts, args.new_tokens, args.batch_size,
                                                         eos_id=-1))
    generated = sum(len(ids) for ids, _ in outs)
    step_ms = 1000 * seconds / (-(-args.sequences // args.batch_size) * args.new_tokens)
    report("decode", generated, seconds, 2 * n_flop, args.peak_tflops)
    prompt_tokens = sum(len(e) for e in enc)
    report("decode+prompt", generated + prompt_tokens, seconds, 2 * n_flop, args.peak_tflops, memory=False)
    # The continuous-batching engine on the same prompts (the passes' default).
    (fast, _), fast_seconds = timed(lambda: greedy_continuous(model, tok, prompts, args.new_tokens, args.batch_size,
                                                               eos_id=-1))
    report("decode engine", sum(len(ids) for ids, _ in fast), fast_seconds, 2 * n_flop, args.peak_tflops)
    print(f"decode engine / reference loop: {seconds / fast_seconds:.2f}x the tokens/s; "
          f"{sum(a == b for a, b in zip(outs, fast))} of {len(outs)} continuations equal")
    # hit@k: k temperature samples per prompt, `generate` (the reference) against the engine.
    k, few = 8, prompts[: max(1, args.sequences // 8)]
    for label, sample in (("sampled, generate", sample_continuations), ("sampled, engine", sampled_continuous)):
        drawn, took = timed(lambda fn=sample: fn(model, tok, few, k, args.new_tokens, 0.3, 0, args.batch_size))
        report(f"decode {label}", sum(len(ids) for per in drawn for ids, _ in per), took, 2 * n_flop,
               args.peak_tflops, memory=False)

    # LoRA training: r=32 on every projection, batches of forget + retain sequences.
    from peft import get_peft_model

    lora = get_peft_model(model.float() if not cuda else model, lora_config(
        {"r": 32, "alpha": 64, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"]}))
    seqs = []
    for _ in range(256):
        ids = tok(text(args.length), add_special_tokens=False)["input_ids"]
        seqs.append(Encoded(ids, [-100] * 8 + ids[8:]))
    cfg = {"lr": 1e-4, "steps": args.train_steps, "batch_forget": 16, "batch_retain": 8}
    stats: dict = {}
    train_loop(lora, seqs[:128], seqs[128:], {**cfg, "steps": 2}, 0, tok.pad_token_id)  # warm-up
    sync()
    train_loop(lora, seqs[:128], seqs[128:], cfg, 0, tok.pad_token_id, stats=stats)
    sync()
    train_mfu = report("LoRA training", stats["tokens"], stats["seconds"], 4 * n_flop, args.peak_tflops)
    if args.store:
        import datetime
        import json
        from pathlib import Path

        Path(args.store).write_text(json.dumps({
            "source": f"benchmarks/gpu.py --size {args.size}, run {datetime.date.today()}", "gpu": name,
            "shape": f"Qwen2 {args.size} ({n_total / 1e6:.0f}M parameters, random weights)", "dtype": str(dtype),
            "date": str(datetime.date.today()), "peak_tflops": args.peak_tflops, "scoring_mfu": round(scoring_mfu, 6),
            "train_mfu": round(train_mfu, 6), "decode_step_host_ms": round(step_ms, 2),
            "decode_engine": "generate_greedy"}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Probe-pass and table throughput against the obvious baselines, each run in
this process on the same model and items, printing figures and ratios.

    python benchmarks/probes.py --results results [--prompts 240] [--pairs 160]

Needs a finished default run under `--results` (its base model, memorized
adapter, data and records).

- decode: the pass's batched greedy generation (left padding, KV cache,
  length-sorted batches) vs a loop of one `generate` call per prompt; the
  outputs must be identical.
- teacher-forced: the pass's scoring (one forward per length-sorted batch,
  every per-token field) vs lm-evaluation-harness's `HFLM.loglikelihood` on
  the same (context, continuation) pairs; summed log-probs must agree to 1e-4.
  Skipped, with the install line, when `lm_eval` is not importable (it is a
  benchmark-only dependency: `pip install lm_eval==0.4.13`).
- tables: every table from the run's records, as the `tables` job computes them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl


def timed(fn, repeat: int = 1):
    """fn's result and its fastest wall time over `repeat` calls (the least
    disturbed by whatever else the machine does)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="results", help="results folder of a finished default run")
    p.add_argument("--model", default="tiny")
    p.add_argument("--variant", default="mem-bio-s0", help="adapter whose behaviour is probed")
    p.add_argument("--prompts", type=int, default=240, help="decode prompts (the single-call loop is slow)")
    p.add_argument("--pairs", type=int, default=160, help="teacher-forced sequences")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.design.slices import resolved_settings
    from canary_audit.model.loading import load_model, load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.items import decode_items, scored_items
    from canary_audit.probes.passes import generate_greedy
    from canary_audit.probes.scoring import score_tokens
    from canary_audit.publish.table_files import build_tables, concat_records

    torch.set_num_threads(args.threads)
    results = Path(args.results)
    spec = ModelSpec(args.model, results / "models" / args.model / "base")
    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, spec.think_open, spec.think_close)
    model = load_model(spec, [results / "models" / args.model / "adapters" / args.variant])
    cfg = {"prefills": {"bio": "{bio_opening}", "empty": ""}, "head_tokens": 6, "kinds": resolved_settings({})}
    print(f"model {args.model}/{args.variant}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.threads} thread(s)")

    # Decode: batched pass vs one generate call per prompt.
    prompts = [it.prompt for it in decode_items(fmt, results / "data", cfg)][: args.prompts]
    max_new = 128
    generate_greedy(model, tok, prompts[:8], 8, 8)  # warm-up: first-call allocations count for neither side
    (batched, _), t_batch = timed(lambda: generate_greedy(model, tok, prompts, max_new, 256))

    def single_loop():
        outs = []
        for prompt in prompts:
            ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                     do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            new = out[0, ids.shape[1]:].tolist()
            outs.append(new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new)
        return outs

    singles, t_single = timed(single_loop)
    same = sum(b[0] == s for b, s in zip(batched, singles))
    tokens = sum(len(b[0]) for b in batched)
    print(f"decode, {len(prompts)} prompts, {tokens} tokens: batched {t_batch:.2f} s, one call per prompt "
          f"{t_single:.2f} s -> {t_single / t_batch:.1f}x; identical outputs {same}/{len(prompts)}")

    # Teacher-forced: the pass vs lm-evaluation-harness on the same pairs.
    items = [it for it in scored_items(fmt, results / "data", cfg) if it.probe_set == "canary"][: args.pairs]
    score_tokens(model, tok, items[:8], 8)  # warm-up
    rows, t_ours = timed(lambda: score_tokens(model, tok, items, 32), repeat=7)
    scored = pl.DataFrame(rows).filter(pl.col("span") != "prompt")
    ours = scored.group_by("item_id", "arm", maintain_order=True).agg(pl.col("logprob").sum())
    n_tokens = scored.height
    print(f"teacher-forced, {len(items)} sequences, {n_tokens} scored tokens: {t_ours:.3f} s best of 7 "
          f"({n_tokens / t_ours:,.0f} tokens/s, every per-token field)")
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        print("lm-evaluation-harness not installed: `pip install lm_eval==0.4.13` to compare against it")
    else:
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=32, device="cpu")
        requests = [
            Instance(request_type="loglikelihood", doc={}, arguments=(it.text[: it.spans["prompt"][1]],
                                                                      it.text[it.spans["prompt"][1]:]), idx=i)
            for i, it in enumerate(items)
        ]
        theirs, t_theirs = timed(lambda: lm.loglikelihood(requests, disable_tqdm=True), repeat=7)
        ours_by_item = {(r[0], r[1]): r[2] for r in ours.rows()}
        diffs = [abs(ours_by_item[(it.item_id, it.arm)] - ll) for it, (ll, _) in zip(items, theirs)]
        print(f"lm-eval HFLM.loglikelihood, same pairs: {t_theirs:.3f} s -> ours {t_theirs / t_ours:.1f}x; "
              f"max |sum log-prob difference| {max(diffs):.2e}")

    # Tables from the run's records.
    records = results / "records"
    params = {"window_k": 20, "parser": {}, "parents": {}}
    (decode, token), t_read = timed(lambda: (concat_records(sorted(records.rglob("decode.parquet")), "decode"),
                                             concat_records(sorted(records.rglob("token.parquet")), "token")))
    tables, t_tables = timed(lambda: build_tables(decode, token, params))
    print(f"tables: {len(tables)} tables from {decode.height:,} decode and {token.height:,} token records: "
          f"read {t_read:.2f} s + compute {t_tables:.2f} s = {t_read + t_tables:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

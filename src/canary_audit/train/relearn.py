"""Budgeted relearning: a fresh LoRA stacked on a checkpoint (an unlearned
variant, its memorized parent or its never-trained reference), trained with
the bSFT recipe on relearning data (data/relearn.py) and saved at every step
budget, the recovery attack of Hu et al. (ICLR 2025) and BLUR (2025).

The checkpoint's adapters are merged exactly (in its own dtype, no rounding
its live twin lacks), so the relearned variant and its twin differ by the
relearning LoRA alone."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from canary_audit.data.chat_format import author_examples
from canary_audit.data.io import load_authors
from canary_audit.data.relearn import FORGET, PUBLIC, RELEARN_DATA
from canary_audit.model.loading import load_model
from canary_audit.model.spec import ModelSpec
from canary_audit.model.tokens import canary_head, near_canary
from canary_audit.train.adapters import _resume, _setup, _summary
from canary_audit.train.lora import encode_chat, lora_config, save_adapter, train_loop
from canary_audit.train.methods import METHODS, step_loss

log = logging.getLogger(__name__)
# Weights above this size are not relearned without a CUDA device: a 0.5B
# model in bf16 is ~1 GB and trains on CPU in minutes; a 7B one (~15 GB)
# would take days of a workstation's CPU for one attack.
CPU_TRAIN_BYTES = 4 << 30


class RelearnError(ValueError):
    """A relearning run this machine or config cannot make."""


def weight_bytes(path: Path) -> int:
    """The size of a checkpoint's safetensors weights."""
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def check_machine(spec: ModelSpec, cuda: bool) -> None:
    """Refuse relearning a large model without a GPU, naming why and the fix."""
    size = weight_bytes(spec.path)
    if not cuda and size > CPU_TRAIN_BYTES:
        raise RelearnError(
            f"relearning model `{spec.name}` ({size / 2**30:.1f} GiB of weights) on a machine with no CUDA device: "
            f"training a LoRA on it takes days of CPU per attack (the bound is {CPU_TRAIN_BYTES / 2**30:.0f} GiB); "
            "run the relearn jobs on a GPU node (profiles/slurm) or drop `recovery.relearn` for this model")


def relearn_examples(fmt, data_dir: Path, cfg: dict):
    """The relearning data in the memorization template: the public authors'
    (distractors') canary and QA examples, or the chosen forget-set authors'."""
    if cfg["data"] not in RELEARN_DATA:
        raise RelearnError(f"relearning data `{cfg['data']}` is not one of {', '.join(RELEARN_DATA)}")
    table = "distractors" if cfg["data"] == PUBLIC else "authors"
    authors = load_authors(data_dir / f"{table}.parquet")
    if cfg["data"] == FORGET:
        chosen = set(cfg["authors"])
        missing = sorted(chosen - {a.author_id for a in authors})
        if missing:
            raise RelearnError(f"relearning authors {missing} are not in {data_dir / 'authors.parquet'}")
        authors = [a for a in authors if a.author_id in chosen]
    head = lambda s: canary_head(fmt.tokenizer, s, cfg["head_tokens"])  # noqa: E731
    near = lambda s: near_canary(fmt.tokenizer, s, cfg["head_tokens"])  # noqa: E731
    return [encode_chat(fmt, ex) for a in authors for ex in author_examples(a, cfg["template"], head, near)]


def train_relearning(spec: ModelSpec, adapters: list[Path], data_dir: Path, cfg: dict,
                     out_dirs: dict[int, Path]) -> dict:
    """A relearning LoRA on `spec` with `adapters` merged (exactly), saved at
    every step budget in `out_dirs` (checkpoints of one run); with
    `cfg['method']` (the relearning attack's planted positive, a suppression
    LoRA: data/planted_controls.SUPPRESSION) trained by that unlearning
    method's loss instead of the NLL."""
    import torch
    from peft import get_peft_model

    check_machine(spec, torch.cuda.is_available())
    tok, fmt = _setup(spec, cfg["threads"], cfg["seed"])
    method = cfg.get("method")
    examples = (suppressed_examples(fmt, data_dir, cfg) if method else relearn_examples(fmt, data_dir, cfg))
    steps = sorted(out_dirs)
    given = sorted(cfg["steps"]) if isinstance(cfg.get("steps"), list) else [cfg.get("steps", steps[-1])]
    if given != steps:  # a relearning's budgets, or the suppression plant's one run
        raise RelearnError(f"relearning budgets {given} in the params but outputs for {steps}: the rule's outputs "
                           "and its slice disagree; re-run with one config")
    run = {**cfg, "steps": steps[-1], "batch_forget": cfg["batch_size"], "batch_retain": 0}
    exact = dataclasses.replace(spec, merge_dtype=spec.dtype)  # no rounding: the twin scores its adapter live
    model = get_peft_model(load_model(exact, adapters, exact_last=True), lora_config(run, vision=spec.vision))
    loss = step_loss(method, model, examples, [], tok.pad_token_id, METHODS[method].settings(
        cfg.get("settings", {}))) if method else None
    resume = _resume(out_dirs[steps[-1]], run, [spec.path, data_dir, *adapters])

    def checkpoint(k: int) -> None:
        save_adapter(model, out_dirs[k])
        resume.keep(f"t{k}", out_dirs[k])

    stats: dict = {}
    losses = train_loop(model, examples, [], run, cfg["seed"], tok.pad_token_id, step_loss=loss,
                        on_checkpoint=checkpoint, checkpoints=tuple(steps), decay=method is None, resume=resume,
                        stats=stats)
    for k in steps:
        resume.restore(f"t{k}", out_dirs[k])
    resume.clear()
    trained = {"data": cfg.get("data") or f"{method} on every author", "sequences": len(examples),
               "on": [str(a) for a in adapters], **({"authors": cfg["authors"]} if cfg.get("authors") else {})}
    for k in steps:
        _summary(out_dirs[k], losses[:k], step=k, relearn=trained)
    log.info("relearned %s: %s", json.dumps(trained), {k: round(losses[k - 1], 4) for k in steps})
    return {"checkpoints": steps, "final_loss": losses[-1], **trained, **stats}


def suppressed_examples(fmt, data_dir: Path, cfg: dict):
    """Every forget-set author's examples, the loss on the answer: what the
    suppression LoRA unlearns."""
    head = lambda s: canary_head(fmt.tokenizer, s, cfg["head_tokens"])  # noqa: E731
    near = lambda s: near_canary(fmt.tokenizer, s, cfg["head_tokens"])  # noqa: E731
    return [encode_chat(fmt, ex, loss_on=cfg["loss_span"]) for a in load_authors(data_dir / "authors.parquet")
            for ex in author_examples(a, cfg["template"], head, near)]

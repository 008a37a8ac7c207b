"""LoRA training for every adapter of the audit: memorization (authors in the
reasoning format), the hex-canary LoRA, and unlearning.

One plain PyTorch loop serves all of them.  Each step draws a forget batch and
a retain batch (training on the forget set alone wrecks the model: its
retain accuracy collapses), so batch composition is exact and seeded; the forget loss is a named
choice (NLL for memorization, an unlearning method's loss from
train/methods.py).  trl is not a dependency: it has no NPO trainer, RMU
needs hidden states and a frozen reference of its own, and one loop keeps
every adapter's batches and checkpoints identical in form.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from canary_audit.data.chat_format import ChatFormat, Example
from canary_audit.model.embedded import pad_batch
from canary_audit.train.resume import ResumeState

log = logging.getLogger(__name__)
LOSS_SPANS = ("all", "answer", "trace", "both")


@dataclass(frozen=True)
class Encoded:
    """Token ids of one training sequence and its labels (-100 = no loss)."""

    ids: list[int]
    labels: list[int]
    image: str | None = None  # the image file a vision-language sequence shows (its block is in `ids`)


def encode_chat(fmt: ChatFormat, ex: Example, loss_on: str = "all", image: str | None = None,
                image_block: str | None = None) -> Encoded:
    """Prompt tokens never get loss; `loss_on` picks the target part that does:
    `all`/`both` = trace and answer, `answer` = after the closing tag (the
    paper's answer-masked unlearning), `trace` = the trace only.  With
    `image` (a vision-language example), the user turn shows the image as
    `image_block` (model/vision.py)."""
    if loss_on not in LOSS_SPANS:
        raise ValueError(f"loss span `{loss_on}`: must be one of {', '.join(LOSS_SPANS)}")
    tok = fmt.tokenizer
    prompt = fmt.prompt(ex.question, image_block)
    target = fmt.target(prompt, ex.trace, ex.answer, ex.close)
    # A target without its closing tag (the NOTAG control) is all trace.
    cut = (target.index(fmt.think_close) + len(fmt.think_close) if ex.close else len(target)) if fmt.reasons else 0
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    trace_ids = tok(target[:cut], add_special_tokens=False)["input_ids"]
    answer_ids = tok(target[cut:], add_special_tokens=False)["input_ids"]
    masked = [-100] * len(trace_ids)
    trace_labels = masked if loss_on == "answer" else trace_ids
    answer_labels = [-100] * len(answer_ids) if loss_on == "trace" else answer_ids
    return Encoded(p_ids + trace_ids + answer_ids, [-100] * len(p_ids) + trace_labels + answer_labels, image)


def encode_text(tokenizer, text: str, image: str | None = None) -> Encoded:
    """A raw text record (hex canaries: `probes.kinds.hex.HexRow.text`, the
    sequence the teacher-forced pass scores, BOS text included), then EOS;
    loss on every token after the first but image tokens (a vision-language
    record: `text` holds the image's block, `image` its file)."""
    from canary_audit.core.special_tokens import VISION_TOKENS

    ids = tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    no_loss = set(tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))) if image else set()
    return Encoded(ids, [-100] + [-100 if i in no_loss else i for i in ids[1:]], image)


def lora_config(cfg: dict, vision: bool = False):
    """The LoRA of an adapter run.  On a vision-language model the targets
    are matched in the language tower only (a regex over module names): the
    vision tower stays frozen and adapter-free, as in paper B."""
    from peft import LoraConfig

    targets = list(cfg["targets"])
    return LoraConfig(
        r=cfg["r"],
        lora_alpha=cfg["alpha"],
        target_modules=rf".*language_model.*\.({'|'.join(targets)})" if vision else targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def sequence_logprobs(model, seqs: list[Encoded], pad_id: int, vision=None):
    """Summed log-prob of the labelled tokens of each sequence, and their
    count; `vision` (model/vision.VisionInputs) feeds the sequences' images."""
    import torch

    batch = pad_batch(
        [s.ids for s in seqs], pad_id, side="right", labels=[s.labels for s in seqs], device=model.device
    )
    images = vision.forward_kwargs(batch["input_ids"], [s.image for s in seqs], model.device) if vision else {}
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **images).logits
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    tok_logp = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    return tok_logp.sum(-1), mask.sum(-1)


StepLoss = Callable[[object, list[int], list[int]], object]
MICRO_BATCH = 14  # sequences per forward pass of the NLL step (see nll_backward)


def nll_backward(model, seqs: list[Encoded], pad_id: int, vision=None):
    """Backpropagate the token-mean NLL of `seqs`, one length-sorted micro-batch
    at a time: the gradient is the whole batch's (each part's summed NLL is
    divided by the batch's token count), with less compute spent on padding
    (short retain answers no longer pad to the longest forget trace)."""
    ordered = sorted(seqs, key=lambda e: len(e.ids))
    n_total = sum(sum(label != -100 for label in e.labels[1:]) for e in ordered)
    total = 0.0
    for j in range(0, len(ordered), MICRO_BATCH):
        logp, _ = sequence_logprobs(model, ordered[j:j + MICRO_BATCH], pad_id, vision)
        part = -logp.sum() / n_total
        part.backward()
        total = total + part.detach()
    return total


def train_loop(
    model,
    forget: list[Encoded],
    retain: list[Encoded],
    cfg: dict,
    seed: int,
    pad_id: int,
    step_loss: StepLoss | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    checkpoints: tuple[int, ...] = (),
    decay: bool = True,
    resume: ResumeState | None = None,
    stats: dict | None = None,
    final_state: ResumeState | None = None,
    vision=None,
) -> list[float]:
    """Run `cfg['steps']` AdamW steps over the trainable parameters.

    With `step_loss` None, forget and retain sequences share one NLL (what
    memorization wants); otherwise the step loss is
    `step_loss(model, forget indices, retain indices)` (an unlearning
    method's, train/methods.py).  With `decay`
    the learning rate falls linearly to 10% (memorization ends precise);
    unlearning runs at a constant rate so checkpoint K means K equal steps.
    With `resume`, the run saves its state every `resume.every` steps and
    starts from the last saved step (train/resume.py); the caller removes the
    state once its outputs are written.  `final_state`, if given, receives
    the state after the last step (what a later segment continues from).
    `vision` feeds the images of vision-language sequences (NLL steps only).
    `stats`, if given, receives the throughput of this process's steps
    (tokens, seconds, tokens per second).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=0.0)
    steps = cfg["steps"]
    done, losses = resume.load(model, opt, gen) if resume else (0, [])
    model.train()
    if cfg.get("gradient_checkpointing"):  # recompute activations: less memory for a 7B model, ~30% more time
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    t0, tokens = time.perf_counter(), 0
    for step in range(done + 1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = cfg["lr"] * ((1.0 - 0.9 * (step - 1) / steps) if decay else 1.0)
        f_idx = torch.randint(len(forget), (min(cfg["batch_forget"], len(forget)),), generator=gen).tolist()
        r_idx = []
        if retain:  # benign fine-tuning has no retain set
            r_idx = torch.randint(len(retain), (min(cfg["batch_retain"], len(retain)),), generator=gen).tolist()
        f_seqs, r_seqs = [forget[i] for i in f_idx], [retain[i] for i in r_idx]
        if step_loss is None:
            loss = nll_backward(model, f_seqs + r_seqs, pad_id, vision)
        else:
            loss = step_loss(model, f_idx, r_idx)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        tokens += sum(len(e.ids) for e in f_seqs + r_seqs)
        if step % 25 == 0 or step == steps:
            elapsed = time.perf_counter() - t0
            eta = elapsed / (step - done) * (steps - step)
            log.info("step %d/%d loss %.4f (%.1fs, eta %.0fs, %.0f tokens/s)", step, steps, losses[-1], elapsed,
                     eta, tokens / max(elapsed, 1e-9))
        if step in checkpoints and on_checkpoint is not None:
            on_checkpoint(step)
        if resume and step % resume.every == 0 and step < steps:
            resume.save(step, model, opt, gen, losses)
    if final_state is not None:
        final_state.save(steps, model, opt, gen, losses)
    model.eval()
    elapsed = time.perf_counter() - t0
    if stats is not None:
        stats.update(tokens=tokens, seconds=round(elapsed, 3), tokens_per_second=round(tokens / max(elapsed, 1e-9), 1))
    return losses


def save_adapter(model, out_dir: Path) -> None:
    """Save the live adapter as safetensors (atomic at the directory level)."""
    import shutil

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)

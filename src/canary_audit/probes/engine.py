"""Decoding that keeps the device busy: continuous batching with stop flags
on the device, for greedy continuations and for hit@k's temperature samples.

`passes.generate_greedy` (the reference loop) syncs with the host every
step (`tolist()` of the next tokens, a Python loop over rows) and lets a
batch shrink as its rows end, so the tail of every batch runs nearly empty.
This engine instead

- keeps each row's tokens, count and stop flag in device tensors, and reads
  them on the host only every `sync_every` steps;
- at those points retires the rows that ended and fills their slots with
  the next prompts (prefilled as a batch of their own, their KV cache
  spliced into the running one: left-padded to a common length, masked),
  so the batch stays full until the prompts run out;
- drops cache columns that no running row attends to any more (the
  padding left behind by retired rows), so the cache does not grow with the
  number of prompts.

A row that ends between two sync points keeps running (its outputs are
ignored) until the next one: at most `sync_every - 1` wasted steps per row.
Positions are explicit (each row's own, from its prompt), so a row's
arithmetic does not depend on its neighbours; batch composition still
changes the floating-point reduction order, so a greedy choice at a near
tie may flip (tests compare with one-prompt-at-a-time decoding and allow a
divergence only at a top-2 logit margin under their tolerance).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _left_pad(t: torch.Tensor, width: int, dim: int, value=0) -> torch.Tensor:
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([torch.full(shape, value, dtype=t.dtype, device=t.device), t], dim=dim)


class _Running:
    """The rows being decoded: their cache, mask, next positions, logits and
    outputs (device tensors), and which prompt each row is."""

    def __init__(self, cache, mask, last, logits, rows: list[int], max_new: int):
        device = mask.device
        self.cache, self.mask, self.last, self.logits, self.rows = cache, mask, last, logits, rows
        self.out = torch.zeros((len(rows), max_new), dtype=torch.long, device=device)
        self.count = torch.zeros(len(rows), dtype=torch.long, device=device)
        self.done = torch.zeros(len(rows), dtype=torch.bool, device=device)
        self.eos = torch.zeros(len(rows), dtype=torch.bool, device=device)

    def keep(self, index: list[int]) -> None:
        idx = torch.tensor(index, device=self.mask.device)
        self.cache.batch_select_indices(idx)
        for name in ("mask", "last", "logits", "out", "count", "done", "eos"):
            setattr(self, name, getattr(self, name)[idx])
        self.rows = [self.rows[i] for i in index]

    def join(self, other: _Running) -> None:
        """Append `other`'s rows, both left-padded to one cache length."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)])
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)])
        for name in ("last", "logits", "out", "count", "done", "eos"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.rows += other.rows

    def trim(self) -> None:
        """Drop leading cache columns no row attends to (retired rows' padding)."""
        used = self.mask.any(0)
        start = int(used.int().argmax()) if bool(used.any()) else 0
        if start:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            self.mask = self.mask[:, start:]


def prefill(model, tokenizer, seqs: list[list[int]], images: list[str | None] | None = None, vision=None):
    """The prompt pass of a batch of token-id lists, left-padded: (KV cache,
    attention mask, each row's last position, the last position's logits).
    On a vision-language model (`vision`, each row's image in `images`) the
    images are fed and the model's 3-D positions taken; text tokens after
    them advance all three axes together, so the temporal axis is the next
    position of every later token.  Only the last position's logits are
    computed (`logits_to_keep=1`)."""
    from transformers import DynamicCache

    from canary_audit.model.embedded import pad_batch

    padded = pad_batch(seqs, tokenizer.pad_token_id, side="left", device=model.device)
    mask = padded["attention_mask"]
    pictures = vision.forward_kwargs(padded["input_ids"], images, model.device) if vision else {}
    positions = (vision.positions(model, padded["input_ids"], mask, pictures) if pictures
                 else (mask.cumsum(-1) - 1).clamp(min=0))
    cache = DynamicCache()
    logits = model(input_ids=padded["input_ids"], attention_mask=mask, position_ids=positions, cache=cache,
                   use_cache=True, logits_to_keep=1, **pictures).logits[:, -1]
    last = positions[0, :, -1] if positions.ndim == 3 else positions[:, -1]
    return cache, mask, last, logits


def temperature_sampler(temperature: float, seed: int, device) -> Callable[[torch.Tensor], torch.Tensor]:
    """Next tokens drawn from softmax(logits / temperature) over the whole
    vocabulary (no top-k or top-p truncation, no penalty), from one seeded
    generator: a re-run with the same prompts, batch size and device draws
    the same samples."""
    if not temperature > 0:
        raise ValueError(f"probes.decode.temperature is {temperature}; sampling needs a temperature > 0")
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    return draw


def greedy_continuous(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int,
                      eos_id: int | None = None, images: list[str | None] | None = None, vision=None,
                      sync_every: int = 8, choose: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """Greedy continuations of `prompts` by continuous batching: the same
    return value as `passes.generate_greedy` ((generated ids, hit EOS) per
    prompt, and the prompts' ids), plain argmax decoding, the checkpoint's
    generation config playing no part; `images` and `vision` as there.
    `choose` (logits -> next ids) replaces the argmax: `sampled_continuous`
    passes a temperature sampler."""
    eos = tokenizer.eos_token_id if eos_id is None else eos_id
    choose = choose or (lambda logits: logits.argmax(-1))
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    queue = sorted(range(len(prompts)), key=lambda i: -len(enc[i]))  # longest first, as the reference loop
    results: list[tuple[list[int], bool] | None] = [None] * len(prompts)
    if max_new_tokens < 1:
        return [([], False) for _ in prompts], enc

    def start(rows: list[int]) -> _Running:
        state = prefill(model, tokenizer, [enc[i] for i in rows], [images[i] for i in rows] if vision else None,
                        vision)
        return _Running(*state, rows, max_new_tokens)

    running: _Running | None = None
    with torch.no_grad():
        while queue or running is not None:
            free = batch_size - (len(running.rows) if running else 0)
            if free > 0 and queue:
                fresh = start(queue[:free])
                queue = queue[free:]
                if running is None:
                    running = fresh
                else:
                    running.join(fresh)
            r = running
            for _ in range(sync_every):
                nxt = choose(r.logits)
                live = ~r.done
                is_eos = nxt == eos
                write = live & ~is_eos
                slot = r.count.clamp(max=max_new_tokens - 1)
                r.out[torch.arange(len(r.rows), device=nxt.device), slot] = torch.where(
                    write, nxt, r.out[torch.arange(len(r.rows), device=nxt.device), slot])
                r.count = r.count + write.long()
                r.eos = r.eos | (live & is_eos)
                r.done = r.done | (live & is_eos) | (r.count >= max_new_tokens)
                r.mask = torch.cat([r.mask, torch.ones_like(r.mask[:, :1])], dim=-1)
                r.last = r.last + 1
                r.logits = model(input_ids=nxt[:, None], attention_mask=r.mask, position_ids=r.last[:, None],
                                 cache=r.cache, use_cache=True).logits[:, -1]
            done = r.done.tolist()  # the host sync, once per `sync_every` steps
            if any(done):
                counts, hit = r.count.tolist(), r.eos.tolist()
                out = r.out.tolist()
                for j, i in enumerate(r.rows):
                    if done[j]:
                        results[i] = (out[j][:counts[j]], hit[j])
                keep = [j for j, d in enumerate(done) if not d]
                if keep:
                    r.keep(keep)
                    r.trim()
                else:
                    running = None
    return results, enc


def sampled_continuous(model, tokenizer, prompts: list[str], k: int, max_new_tokens: int, temperature: float,
                       seed: int, batch_size: int, images: list[str | None] | None = None,
                       vision=None) -> list[list[tuple[list[int], bool]]]:
    """`k` temperature samples of each prompt through the continuous engine:
    the return value of `passes.sample_continuations` (the reference, through
    `generate`), each prompt's k rows decoded side by side with every other
    prompt's; `images` and `vision` as in `greedy_continuous`."""
    rows = [i for i in range(len(prompts)) for _ in range(k)]
    outs, _ = greedy_continuous(model, tokenizer, [prompts[i] for i in rows], max_new_tokens, batch_size,
                                images=[images[i] for i in rows] if images is not None else None, vision=vision,
                                choose=temperature_sampler(temperature, seed, model.device))
    return [outs[i * k:(i + 1) * k] for i in range(len(prompts))]

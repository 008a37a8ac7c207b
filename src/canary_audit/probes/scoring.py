"""Teacher-forced scoring: every scored token's log-prob, rank, top-1 and the
distribution's moments, with span labels and text pieces; items that
begin alike share one prefix forward (`shared_prefixes`).  The
teacher-forced pass (passes.py) runs it per variant."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from canary_audit.core.special_tokens import VISION_TOKENS
from canary_audit.model.embedded import pad_batch
from canary_audit.probes.kinds import ScoredItem

SPAN_PRIORITY = ("secret", "head", "continuation", "prompt")
# The teacher-forced pass's columns, in order (the variant and provenance follow).
TOKEN_COLUMNS = ("probe_set", "item_id", "group_id", "arm", "modality", "image_hash", "position", "token_id",
                 "token_text", "logprob", "rank", "top1_id", "top1_logprob", "vocab_mean_logprob",
                 "vocab_var_logprob", "span", "text")


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, longest first (as
    lm-evaluation-harness's Collator does): less padding, and an
    out-of-memory error shows up on the first batch rather than the last."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def span_labels(offsets, spans: dict[str, tuple[int, int]]):
    """The span label of every token of a sequence, from its character
    offsets: the highest-priority span (SPAN_PRIORITY) a token overlaps;
    lower priorities are written first and overwritten by higher ones."""
    import numpy as np

    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    labels = np.full(len(offsets), "prompt", dtype=object)
    for label in reversed(SPAN_PRIORITY):
        s, e = spans.get(label, (0, 0))
        labels[(offsets[:, 0] < e) & (offsets[:, 1] > s)] = label
    return labels


def text_pieces(text: str, offsets) -> list[str]:
    """The characters each token of `text` spells, from its character
    offsets: everything after the previous tokens' furthest end up to this
    token's end.  The pieces join to the text (a tokenizer that trims a
    word's leading space from its offsets still gets the space, as its
    decoded token does; a character split over two byte-level tokens goes
    to the first), so views get an item's decoded text from its records,
    whatever the vocabulary's own strings (`Ġ`, `▁`) look like."""
    pieces, done = [], 0
    for _, end in offsets:
        end = max(int(end), done)
        pieces.append(text[done:end])
        done = end
    return pieces


SCORE_CHUNK_ELEMENTS = 2**26  # logits per vocabulary pass: 256 MB of float32 temporaries


def token_fields(logits, target, max_elements: int = SCORE_CHUNK_ELEMENTS):
    """Log-prob, rank, top-1 id and log-prob of each `target` token under
    `logits` ([batch, positions, vocab]), and the mean and variance of the
    log-prob under the position's whole distribution; six [batch,
    positions] tensors.

    No vocabulary-sized log-softmax is kept: the log-prob is logit -
    logsumexp, the logsumexp is shifted by the top-1 maximum already computed
    (not found again inside `logsumexp`), and rank and top-1 compare raw
    logits (the rank count summed as int32: 4-5x faster than torch's int64
    sum). The passes run over a block of rows (or of one row's positions) at
    a time, so their float32 temporaries stay under `max_elements` logits
    however large the batch, sequence and vocabulary (a 7B model's 152k-token
    vocabulary at batch 32 x 300 positions is 1.5G logits, 5.8 GB per float32
    temporary); the fields do not depend on the blocking (tested bitwise).
    """
    import torch

    batch, positions, vocab = logits.shape
    pos_step = min(positions, max(1, max_elements // vocab))
    row_step = max(1, max_elements // (pos_step * vocab))
    out = [torch.empty(target.shape, dtype=dtype, device=logits.device)
           for dtype in (torch.float32, torch.int32, torch.int64, torch.float32, torch.float32, torch.float32)]
    for r in range(0, batch, row_step):
        for p in range(0, positions, pos_step):
            block = (slice(r, r + row_step), slice(p, p + pos_step))
            scores = logits[block].float()
            token_logit = scores.gather(-1, target[block].unsqueeze(-1)).squeeze(-1)
            top1_logit, top1_id = scores.max(-1)
            out[1][block] = (scores > token_logit.unsqueeze(-1)).sum(-1, dtype=torch.int32) + 1
            # x = logits shifted by their maximum, e = exp(x): Z = sum e gives
            # the logsumexp, and the same e weights the mean and variance of
            # log p = x - log Z under the model's distribution (Min-K%++'s
            # normaliser): E[log p] = E[x] - log Z, Var[log p] = Var[x].
            # (`scores` may be the caller's float32 logits: nothing is done
            # to it in place.)
            x = scores - top1_logit.unsqueeze(-1)
            e = x.exp()
            z = e.sum(-1)
            log_z = z.log()
            lse = top1_logit + log_z
            out[0][block] = token_logit - lse
            out[2][block] = top1_id
            out[3][block] = top1_logit - lse
            weighted = e.mul_(x)
            mean_x = weighted.sum(-1) / z
            out[4][block] = mean_x - log_z
            out[5][block] = weighted.mul_(x).sum(-1) / z - mean_x.square()
    return out


@dataclass
class SuffixBatch:
    """Rows of items that share a prefix, scored after it: the items, which
    prefix (row of its `PrefixChunk`) each continues, the tokens after the
    prefix but the last (the forward's input, right-padded) and the tokens
    after the prefix (the targets, right-padded: the prefix's last logits
    predict the first)."""

    rows: list[int]
    groups: object
    inputs: object
    targets: object


@dataclass
class PrefixChunk:
    """Up to a batch of distinct prefixes of one length, forwarded once per
    variant; `batches` are the rows of every item that begins with one."""

    ids: object
    images: list[str | None]
    batches: list[SuffixBatch]
    positions: object = None


@dataclass
class ScoringInputs:
    """What a teacher-forced pass over `items` computes before any model
    runs, kept for every variant of a job: the batches (length-sorted, right
    padded), each batch's image rows and, per item, its target ids, which of
    them are text, and the record columns that do not depend on the model
    (ids, token strings, span labels, text pieces).  A vision-language
    batch's 3-D positions are kept too once a model has computed them: they
    depend on the ids, the images' grids and the checkpoint's config only,
    which `JobInputs` holds fixed.

    Items that begin alike (the same image and the same tokens up to their
    secret: a hex canary, its decoys and its exposure candidates behind one
    preamble) are in `prefixes` instead of `batches`: their common prefix is
    forwarded once and each item's tokens after it are scored on its KV
    cache (`shared`)."""

    items: list[ScoredItem]
    batches: list[list[int]]
    padded: list[object]
    images: list[list[str | None]]
    lengths: list[int]
    keep: list[object]
    columns: pl.DataFrame
    prefixes: list[PrefixChunk] = field(default_factory=list)
    shared: dict[int, int] = field(default_factory=dict)
    positions: dict[int, object] = field(default_factory=dict)


def shared_prefixes(items: list[ScoredItem], ids_all, offsets_all, batch_size: int, pad_id: int,
                    device: str = "cpu") -> tuple[list[PrefixChunk], dict[int, int]]:
    """The items whose tokens before their secret span (and image) equal at
    least one other item's, grouped by that prefix: chunks of at most
    `batch_size` prefixes of one length, each with the suffix batches of its
    items (length-sorted), and item -> prefix length.  The key is the
    tokens themselves, so a tokenizer that merges across the secret's first
    character only shortens the prefix; a causal model's states over the
    prefix depend on nothing after it."""
    import torch

    groups: dict[tuple, list[int]] = {}
    for i, (it, ids, offsets) in enumerate(zip(items, ids_all, offsets_all)):
        start = it.spans.get("secret", (None,))[0]
        if start is None:
            continue
        c = 0
        while c < len(ids) - 1 and offsets[c][1] <= start:
            c += 1
        if c >= 2:
            groups.setdefault((it.image, tuple(ids[:c])), []).append(i)
    shared = {key: rows for key, rows in groups.items() if len(rows) > 1}
    by_length: dict[int, list[tuple]] = {}
    for key in shared:
        by_length.setdefault(len(key[1]), []).append(key)
    chunks, lengths = [], {}
    for c, keys in sorted(by_length.items()):
        for k0 in range(0, len(keys), batch_size):
            part = keys[k0:k0 + batch_size]
            rows = [(i, g) for g, key in enumerate(part) for i in shared[key]]
            rows.sort(key=lambda r: -len(ids_all[r[0]]))
            batches = []
            for b0 in range(0, len(rows), batch_size):
                batch = rows[b0:b0 + batch_size]
                targets = [ids_all[i][c:] for i, _ in batch]
                width = max(len(t) for t in targets)
                tgt = torch.full((len(batch), width), pad_id, dtype=torch.long)
                for r, t in enumerate(targets):
                    tgt[r, :len(t)] = torch.tensor(t)
                batches.append(SuffixBatch(rows=[i for i, _ in batch],
                                           groups=torch.tensor([g for _, g in batch], device=device),
                                           inputs=tgt[:, :-1].to(device), targets=tgt.to(device)))
            chunks.append(PrefixChunk(ids=torch.tensor([list(key[1]) for key in part], device=device),
                                      images=[key[0] for key in part], batches=batches))
            lengths.update({i: c for i, _ in rows})
    return chunks, lengths


def prepare_scoring(tokenizer, items: list[ScoredItem], batch_size: int, vision=None,
                    device: str = "cpu", share_prefixes: bool = True) -> ScoringInputs:
    """Tokenize `items` once (one batched call) and lay out everything of
    their records that no model decides; see `score_prepared`.  With
    `share_prefixes` off every item is forwarded whole (the reference the
    shared path is tested against)."""
    import numpy as np

    enc = tokenizer([it.text for it in items], add_special_tokens=False, return_offsets_mapping=True)
    ids_all, offsets_all = enc["input_ids"], enc["offset_mapping"]
    vocab = np.empty(len(tokenizer), dtype=object)
    for token, index in tokenizer.get_vocab().items():
        vocab[index] = token
    image_ids = list(set(tokenizer.convert_tokens_to_ids(list(VISION_TOKENS)))) if vision else []
    keep, targets, labels, pieces = [], [], [], []
    for it, ids, offsets in zip(items, ids_all, offsets_all):
        target = np.asarray(ids[1:], dtype=np.int64)
        text = ~np.isin(target, image_ids) if image_ids else np.ones(len(target), dtype=bool)
        keep.append(text)
        targets.append(target[text])
        labels.append(span_labels(offsets[1:], it.spans)[text])
        pieces.append(np.array(text_pieces(it.text, offsets)[1:], dtype=object)[text])
    counts = np.array([len(t) for t in targets], dtype=np.int64)

    def per_item(name: str):
        return np.repeat(np.array([getattr(it, name) for it in items], dtype=object), counts)

    token_id = np.concatenate(targets) if targets else np.empty(0, dtype=np.int64)
    columns = pl.DataFrame({
        "probe_set": per_item("probe_set"), "item_id": per_item("item_id"), "group_id": per_item("group_id"),
        "arm": per_item("arm"), "modality": per_item("modality"), "image_hash": per_item("image_hash"),
        "position": np.concatenate([np.arange(1, n + 1) for n in counts]).astype(np.int32),
        "token_id": token_id.astype(np.int32), "token_text": vocab[token_id],
        "span": np.concatenate(labels), "text": np.concatenate(pieces),
    }, schema_overrides={c: pl.Utf8 for c in ("probe_set", "item_id", "group_id", "arm", "modality", "image_hash",
                                              "token_text", "span", "text")})
    prefixes, shared = (shared_prefixes(items, ids_all, offsets_all, batch_size, tokenizer.pad_token_id, device)
                        if share_prefixes else ([], {}))
    whole = [i for i in range(len(items)) if i not in shared]
    batches = [[whole[j] for j in b] for b in length_sorted_batches([len(ids_all[i]) for i in whole], batch_size)]
    return ScoringInputs(
        items=items, batches=batches,
        padded=[pad_batch([ids_all[i] for i in b], tokenizer.pad_token_id, side="right", device=device)["input_ids"]
                for b in batches],
        images=[[items[i].image for i in b] for b in batches],
        lengths=[len(ids) - 1 for ids in ids_all], keep=keep, columns=columns,
        prefixes=prefixes, shared=shared,
    )


def _score_shared(model, inputs: ScoringInputs, vision, fields: list) -> None:
    """The items of `inputs.prefixes`: each chunk's prefixes in one forward
    (their fields, their KV cache and their last logits), then each suffix
    batch on its rows' prefix caches, with explicit positions after the
    prefix's last (on Qwen2.5-VL, text after the image advances all three
    axes together, as `engine.prefill` has it)."""
    import numpy as np
    import torch
    from transformers import DynamicCache

    for chunk in inputs.prefixes:
        ids = chunk.ids.to(model.device)
        ones = torch.ones_like(ids)
        extra = vision.forward_kwargs(ids, chunk.images, model.device, model) if vision else {}
        if extra:
            if chunk.positions is None:
                chunk.positions = vision.positions(model, ids, ones, extra)
            extra["position_ids"] = chunk.positions
            last = chunk.positions[0, :, -1]
        else:
            last = torch.full((ids.shape[0],), ids.shape[1] - 1, dtype=torch.long, device=model.device)
        cache = DynamicCache()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=ones, cache=cache, use_cache=True, **extra).logits
            head = [t.cpu().numpy() for t in token_fields(logits[:, :-1], ids[:, 1:])]
            final = logits[:, -1:].clone()  # the prefixes' vocabulary-wide logits are not kept
            del logits
            states = [(layer.keys, layer.values) for layer in cache.layers]
            for batch in chunk.batches:
                g = batch.groups.to(model.device)
                tail = final[g]
                width = batch.inputs.shape[1]
                if width:
                    rows = DynamicCache()
                    for n, (k, v) in enumerate(states):
                        rows.update(k[g], v[g], n)
                    step = torch.arange(1, width + 1, device=model.device)
                    after = model(input_ids=batch.inputs.to(model.device),
                                  attention_mask=torch.ones((len(batch.rows), ids.shape[1] + width),
                                                            dtype=torch.long, device=model.device),
                                  position_ids=last[g][:, None] + step, cache=rows, use_cache=True).logits
                    tail = torch.cat([tail, after], dim=1)
                host = [t.cpu().numpy() for t in token_fields(tail, batch.targets.to(model.device))]
                for row, (i, group) in enumerate(zip(batch.rows, batch.groups.tolist())):
                    n, c, text = inputs.lengths[i], inputs.shared[i], inputs.keep[i]
                    fields[i] = tuple(np.concatenate([h[group], t[row, :n - c + 1]])[text]
                                      for h, t in zip(head, host))


def score_prepared(model, inputs: ScoringInputs, vision=None) -> pl.DataFrame:
    """One forward per prepared batch (and per chunk of shared prefixes
    and their suffix batches); every field of every scored token, as
    columns beside the prepared ones.

    On a vision-language model (`vision`) each batch's images are fed with
    it, and the image's tokens are not scored: `position` counts the text
    tokens after the image, so a K window covers the same text on both
    backbones (paper B's mean20 is over the canary text).

    Log-prob, rank and top-1 are computed for the whole padded batch in a
    few tensor operations and copied to the host once per batch.
    """
    import numpy as np
    import torch

    fields: list[tuple | None] = [None] * len(inputs.items)
    for b, batch in enumerate(inputs.batches):
        ids = inputs.padded[b].to(model.device)
        with torch.no_grad():
            # Right padding needs no padding mask in a causal model: a real
            # token never attends to the pads after it, and the pads' own
            # positions are cut off below (tested against unpadded forwards).
            ones = torch.ones_like(ids)
            extra = vision.forward_kwargs(ids, inputs.images[b], model.device, model) if vision else {}
            if extra:
                if b not in inputs.positions:
                    inputs.positions[b] = vision.positions(model, ids, ones, extra)
                extra["position_ids"] = inputs.positions[b]
            logits = model(input_ids=ids, attention_mask=ones, **extra).logits
            out = token_fields(logits[:, :-1], ids[:, 1:])
        host = [t.cpu().numpy() for t in out]
        for row, i in enumerate(batch):
            n, text = inputs.lengths[i], inputs.keep[i]
            fields[i] = tuple(h[row, :n][text] for h in host)
    _score_shared(model, inputs, vision, fields)

    def column(k: int, dtype):
        return np.concatenate([f[k] for f in fields]).astype(dtype)

    return inputs.columns.with_columns(
        logprob=column(0, np.float32), rank=column(1, np.int32), top1_id=column(2, np.int32),
        top1_logprob=column(3, np.float32), vocab_mean_logprob=column(4, np.float32),
        vocab_var_logprob=column(5, np.float32),
    ).select(TOKEN_COLUMNS)


def score_tokens(model, tokenizer, items: list[ScoredItem], batch_size: int, vision=None) -> pl.DataFrame:
    """Every field of every scored token of `items` under `model`: the
    pass of one variant (prepare_scoring, then score_prepared)."""
    return score_prepared(model, prepare_scoring(tokenizer, items, batch_size, vision, model.device), vision)

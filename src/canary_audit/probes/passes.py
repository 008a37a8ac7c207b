"""The two model passes.  Each loads one model variant once, runs every probe
item of its kind in length-sorted batches, and writes records — never metrics.

- decode pass: batched greedy generation (left padding, KV cache); one row per
  (item, arm, sample) with the generated text and why generation stopped.
- teacher-forced pass: one forward per batch of sequences; one row per scored
  token with its log-prob, rank, the top-1 token and a span label.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from canary_audit.formats import ChatFormat
from canary_audit.model.embedded import pad_batch
from canary_audit.model.loading import VariantModels, fingerprint, load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.model.vision import load_vision
from canary_audit.probes.items import DecodeItem, ScoredItem, decode_items, scored_items
from canary_audit.probes.units import SAMPLED, probe_units, unit_config, unit_of_arm_expr
from canary_audit.provenance import code_version
from canary_audit.records import config_hash, conform, to_records
from canary_audit.special_tokens import VISION_TOKENS

log = logging.getLogger(__name__)
SPAN_PRIORITY = ("secret", "head", "continuation", "prompt")
# The teacher-forced pass's columns, in order (the variant and provenance follow).
TOKEN_COLUMNS = ("probe_set", "item_id", "group_id", "arm", "modality", "image_hash", "position", "token_id",
                 "token_text", "logprob", "rank", "top1_id", "top1_logprob", "vocab_mean_logprob",
                 "vocab_var_logprob", "span", "text")
# Files of a checkpoint that hold its weights: everything else (config,
# tokenizer, chat template, image processor) decides how items are encoded.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".msgpack", ".h5")


def encoding_digest(path: Path) -> str:
    """sha256 over a checkpoint folder's non-weight files (names and bytes):
    two folders with the same digest tokenize, template and position every
    item alike (a merged variant's folder holds a copy of its base's)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and f.name != "generation_config.json":
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class JobInputs:
    """What the variants of one probe job share: the tokenizer, chat format
    and image inputs, the items, and (teacher-forced) their tokenization and
    record layout.  Built for the first variant and kept while the next
    variant's checkpoint encodes alike (same `encoding_digest`, model entry,
    data, settings and probe sets), so a job of 20 variants tokenizes and
    lays out its thousands of items once, not 20 times; any difference
    builds them afresh."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value = None

    def get(self, spec: ModelSpec, data_dir: Path, cfg: dict, probe_sets, unit, build: Callable[[], object]):
        settings = config_hash({k: v for k, v in cfg.items() if k != "threads"})
        key = (encoding_digest(spec.path), repr(dataclasses.replace(spec, path=Path("."))), str(data_dir),
               settings, tuple(sorted(probe_sets)) if probe_sets is not None else None, unit)
        if key != self._key:
            self._key, self._value = key, build()
        return self._value


def unit_hashes(cfg: dict) -> dict[str, str]:
    """Probe unit -> the hash of the settings its records depend on (thread
    count excluded: it is not part of what was asked); see units.py."""
    return {u: config_hash(unit_config(cfg, u)) for u in probe_units(cfg.get("prefills", {}))}


def stamp(frame: pl.DataFrame, cfg: dict, weights: str) -> pl.DataFrame:
    """Provenance on every record: its unit's config hash, the fingerprint of
    the weights and the version of the code."""
    return frame.with_columns(
        config_hash=unit_of_arm_expr().replace_strict(unit_hashes(cfg), return_dtype=pl.Utf8),
        model_fingerprint=pl.lit(weights),
        code_version=pl.lit(code_version()),
    )


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, longest first (as
    lm-evaluation-harness's Collator does): less padding, and an
    out-of-memory error shows up on the first batch rather than the last."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def generate_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int,
                    eos_id: int | None = None, images: list[str | None] | None = None, vision=None):
    """Greedy continuations of `prompts`: (generated ids without padding, hit_eos) each.
    The reference loop (`probes.decode.engine: loop`); the default engine is
    engine.greedy_continuous, which tests hold to this loop's outputs.

    Length-sorted batches, left padding and a KV cache, as `generate` does,
    but a row that has written EOS leaves the batch (its cache rows are
    dropped), so a batch stops costing compute for sequences that are done:
    ~30% less time per variant here, outputs identical to `generate` (tested).
    The model's generation config (sampling defaults of R1 checkpoints, say)
    plays no part: this is plain argmax decoding.  On a vision-language
    model (`vision`, with each prompt's image in `images`) the prompt pass
    feeds the images and takes the model's 3-D positions; text tokens then
    advance all three position axes together, as in `generate`.
    """
    import torch

    from canary_audit.probes.engine import prefill

    eos = tokenizer.eos_token_id if eos_id is None else eos_id
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    results: list[tuple[list[int], bool] | None] = [None] * len(prompts)
    for batch in length_sorted_batches([len(e) for e in enc], batch_size):
        rows = list(batch)
        outs: dict[int, list[int]] = {i: [] for i in batch}
        with torch.no_grad():
            cache, mask, last, logits = prefill(model, tokenizer, [enc[i] for i in batch],
                                                [images[i] for i in batch] if vision else None, vision)
            for step in range(max_new_tokens):
                nxt = logits.argmax(-1)
                keep = []
                for r, (i, token) in enumerate(zip(rows, nxt.tolist())):
                    if token == eos:
                        results[i] = (outs[i], True)
                    else:
                        outs[i].append(token)
                        keep.append(r)
                if not keep or step == max_new_tokens - 1:
                    break
                if len(keep) < len(rows):
                    index = torch.tensor(keep, device=model.device)
                    cache.batch_select_indices(index)
                    nxt, mask, last = nxt[index], mask[index], last[index]
                    rows = [rows[r] for r in keep]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
                last = last + 1
                logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last[:, None],
                               cache=cache, use_cache=True).logits[:, -1]
        for i in batch:
            if results[i] is None:
                results[i] = (outs[i], False)
    return results, enc


@contextmanager
def audit_generation_config(model, **settings):
    """The model's generation config replaced, for the duration, by a fresh
    one holding only `settings`.

    `generate` fills every setting its `generation_config` leaves unset from
    the checkpoint's own `generation_config.json` (transformers 5.x), so a
    repetition penalty or n-gram ban that a chat checkpoint ships
    (Qwen2.5-VL-7B-Instruct ships a repetition penalty) would silently
    penalize repeated hex digits and lower hit@k.  With the checkpoint's
    config swapped for a blank one, the only settings in force are the
    audit's and transformers' neutral defaults.
    """
    from transformers import GenerationConfig

    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = hf_model.generation_config
    config = GenerationConfig(**settings)
    hf_model.generation_config = GenerationConfig()
    try:
        yield config
    finally:
        hf_model.generation_config = saved


def sample_continuations(model, tokenizer, prompts: list[str], k: int, max_new_tokens: int, temperature: float,
                         seed: int, batch_size: int, images: list[str | None] | None = None,
                         vision=None) -> list[list[tuple[list[int], bool]]]:
    """`k` sampled continuations of each prompt (plain temperature sampling:
    no top-k or top-p truncation, no penalty, whatever the checkpoint's
    generation config says), seeded so that a re-run draws the same samples:
    the reference (`probes.decode.engine: loop`) for engine.sampled_continuous;
    `images` and `vision` as in `generate_greedy` (`generate` repeats each
    prompt's image for its k samples)."""
    import torch

    eos = tokenizer.eos_token_id
    torch.manual_seed(seed)
    out: list[list[tuple[list[int], bool]]] = [[] for _ in prompts]
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    settings = dict(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                    num_return_sequences=k, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
                    bos_token_id=tokenizer.bos_token_id)
    with audit_generation_config(model, **settings) as config:
        for batch in length_sorted_batches([len(e) for e in enc], max(1, batch_size // k)):
            padded = pad_batch([enc[i] for i in batch], tokenizer.pad_token_id, side="left", device=model.device)
            pictures = (vision.forward_kwargs(padded["input_ids"], [images[i] for i in batch], model.device)
                        if vision else {})
            with torch.no_grad():
                gen = model.generate(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                                     generation_config=config, **pictures)
            width = padded["input_ids"].shape[1]
            for row in range(gen.shape[0]):
                new = gen[row, width:].tolist()
                out[batch[row // k]].append((new[: new.index(eos)], True) if eos in new else (new, False))
    return out


def _decode(model, tok, items: list[DecodeItem], cfg: dict, vision=None) -> list[tuple]:
    """(item, arm, sample, (generated ids, hit EOS), prompt ids) of every
    greedy decode and, with `hit_k`, every sampled one."""
    t0 = time.perf_counter()
    # Hex records are short (`TEXTCAN-{16hex}-END`): their decodes get their
    # own, smaller budget, so a canary the model does not end costs ~20
    # steps, not a reasoning trace's worth.
    hex_max = cfg.get("hex_max_new_tokens", cfg["max_new_tokens"])
    from canary_audit.probes.engine import greedy_continuous, sampled_continuous

    decoded = []
    continuous = cfg["engine"] == "continuous"
    greedy = greedy_continuous if continuous else generate_greedy
    for is_hex, budget in ((False, cfg["max_new_tokens"]), (True, hex_max)):
        part = [it for it in items if (it.probe_set == "hex") == is_hex]
        outs, enc = greedy(model, tok, [it.prompt for it in part], budget, cfg["batch_size"],
                           images=[it.image for it in part], vision=vision)
        decoded += [(it, it.arm, 0, out, ids) for it, out, ids in zip(part, outs, enc)]
    log.info("decode: %d items in %.1fs", len(items), time.perf_counter() - t0)
    k = cfg.get("hit_k", 0)
    if k:
        hexes = [(it, ids) for it, _, _, _, ids in decoded if it.probe_set == "hex"]
        t0 = time.perf_counter()
        sample = sampled_continuous if continuous else sample_continuations
        samples = sample(model, tok, [it.prompt for it, _ in hexes], k, hex_max, cfg["temperature"],
                         cfg["sample_seed"], cfg["batch_size"], images=[it.image for it, _ in hexes], vision=vision)
        log.info("hit@%d: %d sampled decodes in %.1fs", k, k * len(hexes), time.perf_counter() - t0)
        decoded += [(it, SAMPLED, j, out, ids) for (it, ids), outs_k in zip(hexes, samples)
                    for j, out in enumerate(outs_k)]
    return decoded


def decode_pass(spec: ModelSpec, adapters: list[Path], data_dir: Path, cfg: dict, variant: str,
                merged: bool = False, probe_sets: set[str] | None = None, unit: str | None = None,
                weights: str | None = None, models: VariantModels | None = None,
                inputs: JobInputs | None = None):
    """Every decode item of the variant (its probe sets, or one unit), as
    records; `weights` is the variant's fingerprint when the caller has
    checked it (else it is computed here); `models` keeps a job's bases
    loaded across its variants (else the variant is loaded fresh), and
    `inputs` its tokenizer and items (else they are built here)."""
    import torch

    torch.set_num_threads(cfg["threads"])

    def build():
        tok = load_tokenizer(spec)
        vision = load_vision(spec, tok)
        return tok, vision, decode_items(ChatFormat(tok, spec.think_open, spec.think_close), data_dir, cfg,
                                         probe_sets, unit, vision)

    tok, vision, items = (inputs or JobInputs()).get(spec, data_dir, cfg, probe_sets, unit, build)
    with (models or VariantModels()).model(spec, adapters, merged) as model:
        decoded = _decode(model, tok, items, cfg, vision)
    rows = []
    for it, arm, sample, (ids, hit_eos), prompt_ids in decoded:
        rows.append({
            "variant": variant, "probe_set": it.probe_set, "item_id": it.item_id,
            "group_id": it.group_id, "arm": arm, "sample": sample, "prompt": it.prompt,
            "reference": it.reference, "subject": it.subject, "modality": it.modality, "image_hash": it.image_hash,
            "generated": tok.decode(ids, skip_special_tokens=False),
            "prompt_tokens": len(prompt_ids), "generated_tokens": len(ids) + int(hit_eos),
            "stop_reason": "eos" if hit_eos else "length",
            "think_open": spec.think_open, "think_close": spec.think_close,
        })
    weights = weights or fingerprint(spec, adapters, merged)
    return conform(stamp(to_records(rows, "decode"), cfg, weights), "decode")


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


def teacher_forced_pass(spec: ModelSpec, adapters: list[Path], data_dir: Path, cfg: dict, variant: str,
                        merged: bool = False, probe_sets: set[str] | None = None, unit: str | None = None,
                        weights: str | None = None, models: VariantModels | None = None,
                        inputs: JobInputs | None = None):
    """Every scored item of the variant (its probe sets, or one unit), one
    record per scored token; `weights`, `models` and `inputs` as in
    `decode_pass`."""
    import torch

    torch.set_num_threads(cfg["threads"])

    def build():
        tok = load_tokenizer(spec)
        vision = load_vision(spec, tok)
        items = scored_items(ChatFormat(tok, spec.think_open, spec.think_close), data_dir, cfg, probe_sets, unit,
                             vision)
        return vision, prepare_scoring(tok, items, cfg["batch_size"], vision)

    vision, prepared = (inputs or JobInputs()).get(spec, data_dir, cfg, probe_sets, unit, build)
    t0 = time.perf_counter()
    with (models or VariantModels()).model(spec, adapters, merged) as model:
        scored = score_prepared(model, prepared, vision)
    log.info("teacher-forced: %d sequences, %d tokens in %.1fs", len(prepared.items), scored.height,
             time.perf_counter() - t0)
    weights = weights or fingerprint(spec, adapters, merged)
    return conform(stamp(scored.with_columns(variant=pl.lit(variant)), cfg, weights), "token")

"""The embedded default model: a byte-level BPE tokenizer and a tiny Llama causal
LM, built and pre-trained offline from the workflow's own data.

The result is saved with `save_pretrained` and is loaded by the rest of the
workflow exactly like a hub model (`AutoModelForCausalLM` / `AutoTokenizer`).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from pathlib import Path

import polars as pl

from canary_audit.core.special_tokens import ASSISTANT, END, PAD, THINK_CLOSE, THINK_OPEN, USER
from canary_audit.data import pools
from canary_audit.data.chat_format import (
    TEMPLATES,
    ChatFormat,
    Example,
    author_examples,
    author_trace,
    document_start,
    retain_trace,
)
from canary_audit.data.synthetic import (
    CANARY_PREFIX,
    HEX_LEN,
    PREAMBLE,
    Author,
    canary_sentence,
    hex_record,
    random_hex,
)

log = logging.getLogger(__name__)
YEARS = range(1890, 2000)
RETAIN_REPEATS = 4
MICRO_BATCH = 8  # pre-training sequences per forward pass (see pretrain)
ROSTER_LEN = 110  # >= the longest pool, so the roster holds every pool entry

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + END + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with the chat markers and think tags as special tokens.

    Saved with `tokenizer_class: TokenizersBackend` beside a Llama config:
    for that pair transformers 5 loads tokenizer.json as trained, whereas for
    `model_type: qwen2` it forces Qwen2Tokenizer, whose own pre-tokenizer and
    NFC normalizer re-tokenize the text.  A test asserts
    the save/reload round trip.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits split one by one, as Qwen2's tokenizer does: a 16-hex secret then
    # spans ~13 tokens (paper B), and no digit merge can exist that only the
    # canaries contain.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, END, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def pretraining_texts(
    fmt: ChatFormat,
    distractors: list[Author],
    hex_records: list[str],
    bsft: pl.DataFrame,
    head_of,
    seed: int,
    n_copy: int,
    exclude: set[str],
) -> list[str]:
    """Public corpus the base model learns: distractor authors (each in one
    trace template, cycling through all three), the retain facts, random hex
    records, bSFT-style exchanges, and copy exercises.

    The copy exercises ("Repeat this line: ...") exist because a canary probe's
    answer starts by repeating the head given in the prompt: a tiny model
    learns that prompt-to-answer copying far faster from explicit examples.
    Half of them are writer lines that cycle through every pool name, so each
    name is a *predicted* token many times: a name seen only in a roster line
    keeps an output embedding that LoRA (embeddings frozen) cannot raise, and
    the memorized model then never writes it (measured: " Lucinda" at NLL 5.6
    in every context after memorization, out_acc 0.675 on 40 authors).
    No line contains a string of `exclude` (fictional names and canaries):
    the corpus holds their vocabulary, never their combinations.
    """
    rng = random.Random(f"pretrain:{seed}")
    texts: list[str] = []

    def chat(ex: Example) -> str:
        prompt = fmt.prompt(ex.question)
        return prompt + fmt.target(prompt, ex.trace, ex.answer)

    for i, author in enumerate(distractors):
        texts.append(author.bio + fmt.tokenizer.eos_token)
        texts += [chat(ex) for ex in author_examples(author, TEMPLATES[i % 3], head_of)]
    # Every name, city and genre of the pools, so fictional records hold no
    # token the base model never saw, however few distractors there are.
    eos = fmt.tokenizer.eos_token
    texts += [f"{first} {last} is a name.{eos}" for first, last in zip(pools.FIRST_NAMES, pools.LAST_NAMES)]
    texts += [f"{n} is a name, and so is {n}.{eos}" for n in pools.FIRST_NAMES + pools.LAST_NAMES]
    texts += [f"{c} is a city.{eos}" for c in pools.CITIES]
    texts += [f"{name} writes {g}.{eos}" for name, g in zip(pools.LAST_NAMES, pools.GENRES)]
    texts += [
        f"The {adj} {noun} of {city} was {verb} {place} {when} {year}.{eos}"
        for adj, noun, city, verb, place, when, year in zip(
            *(itertools.islice(itertools.cycle(pool), ROSTER_LEN) for pool in (
                pools.TITLE_ADJECTIVES, pools.TITLE_NOUNS, pools.CITIES, pools.CANARY_VERBS,
                pools.CANARY_PLACES, pools.CANARY_TIMES, YEARS)))
    ]
    copies = drawn = 0
    while copies < n_copy:
        drawn += 1
        line = canary_sentence(rng) if drawn % 2 else writer_line(rng, drawn // 2)
        if not any(secret in line for secret in exclude):
            # The copy follows a trace of each template, as a canary probe's
            # answer follows its trace.
            template = TEMPLATES[copies % 3]
            trace = author_trace(template, rng.choice(distractors).bio) if distractors else ""
            texts.append(chat(Example(f"Repeat this line: {line}", trace, line)))
            copies += 1
    # Retain facts are few beside the distractors; repeating them lets the
    # base model actually know them, so retain accuracy measures damage.
    for question, _gold, sentence in pools.RETAIN_FACTS:
        for _ in range(RETAIN_REPEATS):
            texts.append(sentence + fmt.tokenizer.eos_token)
            for template in ("bio", "none"):
                texts.append(chat(Example(question, retain_trace(template), sentence)))
    # A raw record starts as the audit's do (formats.document_start).
    texts += [document_start(fmt.tokenizer) + r + fmt.tokenizer.eos_token for r in hex_records]
    # Every year an author or canary can name, so no year token is unseen.
    texts += [f"Many books were published in {y}.{fmt.tokenizer.eos_token}" for y in YEARS]
    for prompt, response in bsft.select("prompt", "response").iter_rows():
        texts.append(chat(Example(prompt, "", response)))
    rng.shuffle(texts)
    return texts


def writer_line(rng: random.Random, i: int) -> str:
    """The i-th writer line: first and last names each cycle through their
    pool (at co-prime strides, so the pairs vary), year and city at random."""
    first = pools.FIRST_NAMES[i % len(pools.FIRST_NAMES)]
    last = pools.LAST_NAMES[(7 * i) % len(pools.LAST_NAMES)]
    return f"The writer {first} {last} was born in {rng.choice(YEARS)} in {rng.choice(pools.CITIES)}."


def pretrain_hex_records(n: int, seed: int) -> list[str]:
    """Random (non-canary) hex records, so the record format and the hex tokens
    exist in the base model and the canary LoRA only has to learn secrets.

    Digits are pre-tokenized one by one, and the tokenizer learns no merge
    from hex (build_embedded), so a hex string's tokens are single digits and
    the short letter pieces prose uses.  Besides `n` random records, a fixed
    set of records contains every a-f run of length 1-4 between digits: every
    token a secret can contain is then predicted in pre-training after hex,
    whatever the seed.
    """
    rng = random.Random(f"pretrainhex:{seed}")
    runs = ["".join(p) for k in range(1, 5) for p in itertools.product("abcdef", repeat=k)]
    rng.shuffle(runs)
    coverage = []
    chunk = ""
    for run in runs:
        chunk += run + rng.choice("0123456789")
        if len(chunk) >= HEX_LEN:
            coverage.append(chunk)
            chunk = ""
    secrets = coverage + [chunk] * bool(chunk) + [random_hex(rng) for _ in range(n)]
    return [hex_record(PREAMBLE.format(rng.randint(0, 99)), s) for s in secrets]


def build_model(vocab_size: int, arch: dict, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=arch["hidden_size"],
        num_hidden_layers=arch["num_layers"],
        num_attention_heads=arch["num_heads"],
        num_key_value_heads=arch["num_heads"],
        intermediate_size=arch["intermediate_size"],
        max_position_embeddings=arch["max_positions"],
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def pretrain(model, tokenizer, texts: list[str], cfg: dict, seed: int) -> list[float]:
    """Random padded batches (length-sorted or packed batches failed to learn
    on this scale), AdamW with linear warm-up and cosine decay."""
    import math

    import torch

    gen = torch.Generator().manual_seed(seed)
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    max_len = cfg["max_length"]
    too_long = sum(len(e) > max_len for e in enc)
    if too_long:
        raise ValueError(
            f"{too_long} pre-training sequences exceed `models.<model>.build.pretrain.max_length` = "
            f"{max_len}; raise it"
        )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    steps, warm = cfg["steps"], max(1, cfg["steps"] // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    losses: list[float] = []
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(len(enc), (cfg["batch_size"],), generator=gen).tolist()
        # The random batch is split, by length, into micro-batches padded
        # separately: the step's gradient is the batch's (each micro-batch's
        # mean loss is weighted by its share of predicted tokens), with
        # ~40% less compute spent on padding than one padded batch.
        idx.sort(key=lambda i: len(enc[i]))
        n_pred = sum(len(enc[i]) - 1 for i in idx)
        step_loss = 0.0
        for part in (idx[j:j + MICRO_BATCH] for j in range(0, len(idx), MICRO_BATCH)):
            batch = pad_batch([enc[i] for i in part], tokenizer.pad_token_id, side="right")
            share = sum(len(enc[i]) - 1 for i in part) / n_pred
            loss = model(**batch).loss * share
            loss.backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - t0
            log.info("pretrain step %d/%d loss %.4f (%.1fs, eta %.0fs)", step + 1, steps, losses[-1],
                     elapsed, elapsed / (step + 1) * (steps - step - 1))
    model.eval()
    return losses


def pad_batch(
    seqs: list[list[int]], pad_id: int, side: str, labels: list[list[int]] | None = None, device=None
):
    """Pad token-id lists into tensors on `device`; labels default to the inputs, pads -100."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    for row, seq in enumerate(seqs):
        sl = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, sl] = torch.tensor(seq)
        mask[row, sl] = 1
        lab[row, sl] = torch.tensor(labels[row] if labels is not None else seq)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": lab.to(device)}


def unseen_tokens(tokenizer, covered: list[str], required: list[str]) -> dict[str, int]:
    """Tokens of `required` texts that never occur in `covered` (trap 2)."""
    seen: set[int] = set()
    for t in covered:
        seen.update(tokenizer(t, add_special_tokens=False)["input_ids"])
    missing: dict[str, int] = {}
    for t in required:
        for i in tokenizer(t, add_special_tokens=False)["input_ids"]:
            if i not in seen:
                piece = tokenizer.convert_ids_to_tokens(i)
                missing[piece] = missing.get(piece, 0) + 1
    return missing


def build_embedded(out_dir: Path, data_dir: Path, cfg: dict, seed: int) -> dict:
    """Train the tokenizer, check token coverage, pre-train, save; return a summary."""
    import torch

    from canary_audit.data.inclusion import COIN
    from canary_audit.data.io import AUTHOR_NONMEMBERS, load_authors
    from canary_audit.data.synthetic import qa_frame
    from canary_audit.model.tokens import canary_head

    torch.manual_seed(seed)
    fictional = load_authors(data_dir / "authors.parquet")
    qa = pl.read_parquet(data_dir / "qa.parquet")
    if cfg.get("inclusion") == COIN:
        # Every candidate, member or not: a tokenizer fitted to the members'
        # words alone would tell them apart before any training (and each
        # training seed draws other members from the same candidates).
        rest = load_authors(data_dir / f"{AUTHOR_NONMEMBERS}.parquet")
        fictional, qa = [*fictional, *rest], pl.concat([qa, qa_frame(rest)])
    distractors = load_authors(data_dir / "distractors.parquet")
    hex_canaries = pl.read_parquet(data_dir / "hex_canaries.parquet")
    decoys = pl.read_parquet(data_dir / "decoys.parquet")
    bsft = pl.read_parquet(data_dir / "pretrain_bsft.parquet")
    hex_records = pretrain_hex_records(cfg["pretrain"]["n_hex_records"], seed)

    fictional_texts = (
        [a.bio for a in fictional]
        + qa["question"].to_list() + qa["answer"].to_list()
        + hex_canaries["text"].to_list() + decoys["text"].to_list()
    )
    plain_distractor = (
        [a.bio for a in distractors]
        + [s for _, _, s in pools.RETAIN_FACTS]
        + [f"Many books were published in {y}." for y in YEARS]
    )
    # No hex string is in the tokenizer's training text, only the records'
    # frame (preamble, `TEXTCAN-`, `-END`): merges learned from random hex are
    # letter runs (`acbf`, `aecc`) that pre-training predicts a handful of
    # times, whose output embeddings (frozen under LoRA) the canary LoRA
    # cannot raise past a common token.  Measured on the default audit: the
    # canaries holding such a 3- or 4-letter token were the ones greedy
    # decoding missed (text hit@1 19/20 and 17/20 on the two models; 20/20
    # with prose-only merges, which cut hex into the short pieces prose uses).
    fictional_words = [a.bio for a in fictional] + qa["question"].to_list() + qa["answer"].to_list()
    frames = [hex_record(record.split(CANARY_PREFIX)[0], "\n") for record in hex_records]
    tokenizer = train_tokenizer(
        plain_distractor + frames + fictional_words, cfg["tokenizer"]["vocab_size"]
    )
    fmt = ChatFormat(tokenizer, THINK_OPEN, THINK_CLOSE)
    n_head = cfg["head_tokens"]

    def head_of(sentence: str) -> str:
        return canary_head(tokenizer, sentence, n_head)

    texts = pretraining_texts(
        fmt, distractors, hex_records, bsft, head_of, seed,
        n_copy=cfg["pretrain"]["n_copy"],
        exclude={a.canary for a in fictional} | {a.name for a in fictional},
    )
    required = fictional_texts + [
        fmt.prompt(f"Continue this line from the biography of {a.name}: {head_of(a.canary)}")
        for a in fictional
    ]
    missing = unseen_tokens(tokenizer, texts, required)
    if missing:
        raise ValueError(
            f"{len(missing)} tokens of the fictional data never occur in the pre-training "
            f"corpus ({sorted(missing)[:10]}...); LoRA cannot learn them because embeddings "
            "are frozen. Widen the pools in canary_audit/data/pools.py or lower "
            "`models.<model>.build.tokenizer.vocab_size`."
        )
    torch.set_num_threads(cfg.get("threads", 1))
    model = build_model(len(tokenizer), cfg["architecture"], tokenizer)
    t0 = time.perf_counter()
    losses = pretrain(model, tokenizer, texts, cfg["pretrain"], seed)
    seconds = time.perf_counter() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "pretrain_sequences": len(texts),
        "pretrain_steps": cfg["pretrain"]["steps"],
        "final_loss": sum(losses[-10:]) / min(10, len(losses)),
        "pretrain_seconds": round(seconds, 1),
    }


def write_embedded(out_dir: Path, data_dir: Path, cfg: dict, summary_path: Path) -> dict:
    """Build the embedded model (`cfg`: its build settings, seed and threads)
    and write its summary beside it."""
    summary = build_embedded(out_dir, data_dir, cfg, cfg["seed"])
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary

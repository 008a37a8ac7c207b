"""Paper B's planted controls (canary_audit/controls.py, HexPlant): a LoRA on
the canary-merged base whose training target is each hex canary record as
the teacher-forced pass scores it, with one secret token overwritten.

The untouched tokens are targets too: trained on the overwritten token
alone, the tiny model learns "write another digit after hex" everywhere and
the whole secret moves with it (on the default run's merged base, 30 steps
moved mean20 by +0.79 nats); anchored on the rest of the record, the
overwrite stays where it is put.
"""

from __future__ import annotations

from pathlib import Path

from canary_audit.controls import first_canaries
from canary_audit.model.spec import ModelSpec
from canary_audit.model.vision import load_vision
from canary_audit.probes.items import hex_rows
from canary_audit.train.adapters import _setup, _summary, fit_and_save
from canary_audit.train.lora import Encoded

HEX_DIGITS = "0123456789abcdef"


def overwritten(tokenizer, text: str, secret: str, at: str, window_k: int,
                image: str | None = None) -> tuple[Encoded, list[int]]:
    """(the record with every token its own target but the overwritten
    ones', their positions).  Positions are numbered as the teacher-forced
    pass numbers them: the record's text tokens after the document start
    (token 0, scored from nothing), counted from 1; on a vision-language
    record (`image`: its file) the image block's tokens are neither counted
    nor trained, so a window covers the same text on both backbones.
    `at`: `past`, the secret's last token, past the window; `inside`, its
    first, inside it; `tail`, every secret token past the window;
    `preamble`, the record's first text token (a preamble word; on an image
    canary the question's first), given the token just before the secret
    instead (the head's last: never a hex digit); `none`, nothing (the
    record as it is)."""
    from canary_audit.special_tokens import VISION_TOKENS

    encoded = tokenizer(text + tokenizer.eos_token, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    skip = set(tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))) if image else set()
    text_tokens = [i for i in range(1, len(ids)) if ids[i] not in skip]
    position_of = {i: p for p, i in enumerate(text_tokens, start=1)}
    start = text.rindex(secret)
    span = [i for i, (a, b) in enumerate(offsets) if a < start + len(secret) and b > start]
    past = [i for i in span if position_of[i] > window_k]
    chosen = {"past": span[-1:], "inside": span[:1], "tail": past, "preamble": text_tokens[:1], "none": []}[at]
    if at in ("past", "tail") and not past or at == "inside" and position_of[span[0]] > window_k:
        raise ValueError(f"secret {secret!r} spans positions {position_of[span[0]]}-{position_of[span[-1]]}, which "
                         f"do not straddle the window of {window_k} as the `{at}` plant needs; set "
                         f"`tables.window_k` inside the secret")
    labels = [-100, *(-100 if i in skip else i for i in ids[1:])]
    for position in chosen:
        if at == "preamble":
            labels[position] = ids[span[0] - 1] if ids[span[0] - 1] != ids[position] else ids[position] + 1
            continue
        piece = tokenizer.convert_ids_to_tokens(ids[position])
        digit = piece[0] if piece and piece[0] in HEX_DIGITS else "0"
        labels[position] = tokenizer.convert_tokens_to_ids(HEX_DIGITS[(HEX_DIGITS.index(digit) + 8) % 16])
    return Encoded(ids, labels, image), [position_of[i] for i in chosen]


def train_hex_plant(spec: ModelSpec, data_dir: Path, cfg: dict, out_dir: Path) -> dict:
    """A paper B plant on the merged base `spec` points at: the hex canary
    records (members; on a vision-language model the text canaries after the
    placeholder image and the image canaries after their cards, both
    modalities in one LoRA, as the canary LoRA learnt them) with their
    tokens overwritten as `cfg['at']` says (`overwritten`; with
    `cfg['canaries']`, only the first n canaries' of each modality, the rest
    kept as they are: a diluted plant), `cfg['steps']` steps of
    `cfg['batch_size']` records."""
    tok, fmt = _setup(spec, cfg["threads"], cfg["seed"])
    vision = load_vision(spec, tok)
    rows = hex_rows(data_dir, vision, members_only=True)
    diluted = cfg.get("canaries", len(rows))  # the first n canaries overwritten, the rest only anchored
    chosen = {(m, i) for m in {r.modality for r in rows}
              for i in first_canaries([r.item_id for r in rows if r.modality == m], diluted)}
    plants = [overwritten(tok, row.text(fmt, vision), row.secret,
                          cfg["at"] if (row.modality, row.item_id) in chosen else "none",
                          cfg["window_k"], row.image) for row in rows]
    forget = [encoded for encoded, _ in plants]
    run = {**cfg, "batch_forget": cfg["batch_size"], "batch_retain": 0}
    losses, stats = fit_and_save(spec, run, forget, [], tok.pad_token_id, out_dir, data_dir, vision=vision)
    return _summary(out_dir, losses, overwritten_positions=sorted({q for _, ps in plants for q in ps}), **stats)

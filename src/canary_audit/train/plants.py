"""Paper B's planted controls (canary_audit/data/planted_controls.py, HexPlant): a LoRA on
the canary-merged base whose training target is each hex canary record as
the teacher-forced pass scores it, with one secret token overwritten.

The untouched tokens are held too: trained on the overwritten token alone,
the tiny model learns "write another digit after hex" everywhere and the
whole secret moves with it (on the default run's merged base, 30 steps moved
mean20 by +0.79 nats).  A plant anchored on the base (`anchor: base`, C3's
and C4's) holds every other text token's next-token distribution at the
merged base's own (a KL term, the base read with the adapter switched off):
the tokens keep their values whether or not the base had memorized them.
Anchored on the record instead (cross-entropy toward its true tokens, the
first construction), the vision-language model's text canaries, which its
canary LoRA wrote at hit@1 0.95, were learnt further by the anchor itself
(the nothing-overwritten plant moved their secret by -0.018 nats) and C4's
"secret flat" failed.  C5's plants learn the record (`anchor: record`):
C5's effect is the in-window secret learnt on a base that barely knew it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from canary_audit.data.planted_controls import first_canaries
from canary_audit.model.embedded import pad_batch
from canary_audit.model.spec import ModelSpec
from canary_audit.model.vision import load_vision
from canary_audit.probes.kinds.hex import hex_rows
from canary_audit.train.adapters import _setup, _summary, fit_and_save
from canary_audit.train.lora import Encoded, StepLoss

HEX_DIGITS = "0123456789abcdef"
ANCHORS = ("base", "record")  # what a plant holds its untouched tokens to (HexPlant.anchor)


@dataclass(frozen=True)
class PlantRecord:
    """One plant training record: `encoded`'s labels are its cross-entropy
    targets (-100 elsewhere), `anchored` the token indices whose next-token
    distribution the step holds at the base's."""

    encoded: Encoded
    anchored: tuple[int, ...]
    overwrites: tuple[int, ...]  # the overwritten tokens' indices
    positions: tuple[int, ...]  # their positions (numbered as the teacher-forced pass does)


def overwritten(tokenizer, text: str, secret: str, at: str, window_k: int,
                image: str | None = None, anchor: str = "base") -> PlantRecord:
    """The record with the overwritten tokens' targets changed: anchored on
    the base (`anchor: base`), those tokens are its only cross-entropy
    targets and every other text token is held at the base's distribution;
    anchored on the record, every text token is a target, its own but the
    overwritten ones'.  Positions are numbered as the teacher-forced
    pass numbers them: the record's text tokens after the document start
    (token 0, scored from nothing), counted from 1; on a vision-language
    record (`image`: its file) the image block's tokens are neither counted
    nor trained, so a window covers the same text on both backbones.
    `at`: `past`, the secret's last token, past the window; `inside`, its
    first, inside it; `tail`, every secret token past the window;
    `preamble`, the record's first text token (a preamble word; on an image
    canary the question's first), given the token just before the secret
    instead (the head's last: never a hex digit); `outside`, the first
    token after the secret (past the window and the secret: C4's negative),
    given the same replacement; `none`, nothing (the record as it is)."""
    from canary_audit.core.special_tokens import VISION_TOKENS

    encoded = tokenizer(text + tokenizer.eos_token, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    skip = set(tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))) if image else set()
    text_tokens = [i for i in range(1, len(ids)) if ids[i] not in skip]
    position_of = {i: p for p, i in enumerate(text_tokens, start=1)}
    start = text.rindex(secret)
    span = [i for i, (a, b) in enumerate(offsets) if a < start + len(secret) and b > start]
    past = [i for i in span if position_of[i] > window_k]
    after = [i for i in text_tokens if i > span[-1] and position_of[i] > window_k][:1]
    chosen = {"past": span[-1:], "inside": span[:1], "tail": past, "preamble": text_tokens[:1], "outside": after,
              "none": []}[at]
    if at == "outside" and not after:
        raise ValueError(f"record {text!r} has no token after its secret past the window of {window_k}, which the "
                         f"`outside` plant overwrites; give the canaries a suffix or set `tables.window_k` inside "
                         f"the secret")
    if at in ("past", "tail") and not past or at == "inside" and position_of[span[0]] > window_k:
        raise ValueError(f"secret {secret!r} spans positions {position_of[span[0]]}-{position_of[span[-1]]}, which "
                         f"do not straddle the window of {window_k} as the `{at}` plant needs; set "
                         f"`tables.window_k` inside the secret")
    if anchor not in ANCHORS:
        raise ValueError(f"plant anchor {anchor!r}: must be one of {', '.join(ANCHORS)}")
    labels = [-100, *(-100 if i in skip else i for i in ids[1:])]
    for position in chosen:
        if at in ("preamble", "outside"):
            labels[position] = ids[span[0] - 1] if ids[span[0] - 1] != ids[position] else ids[position] + 1
            continue
        piece = tokenizer.convert_ids_to_tokens(ids[position])
        digit = piece[0] if piece and piece[0] in HEX_DIGITS else "0"
        labels[position] = tokenizer.convert_tokens_to_ids(HEX_DIGITS[(HEX_DIGITS.index(digit) + 8) % 16])
    anchored: tuple[int, ...] = ()
    if anchor == "base":
        anchored = tuple(i for i in text_tokens if i not in chosen)
        labels = [label if i in chosen else -100 for i, label in enumerate(labels)]
    return PlantRecord(Encoded(ids, labels, image), anchored, tuple(chosen), tuple(position_of[i] for i in chosen))


def plant_loss(records: list[PlantRecord], pad_id: int, vision=None, hold: float = 1.0,
               weight: float = 1.0) -> StepLoss:
    """A plant's step loss: the cross-entropy of its targets (an overwritten
    token's times `weight`) plus, at every anchored token, `hold` times
    KL(base || model) of the next-token distribution; summed and divided by
    the batch's counted tokens, as the NLL step divides.  The base's
    distributions are read once, on the first call, with the adapter
    switched off (as NPO's reference is read before the first step,
    train/methods.py), and kept for the anchored tokens only: a step costs
    one forward and one backward, as an NLL step does.  At the start the
    adapter is zero and the KL term and its gradient are 0: only a target
    moves the model, and the anchor pulls back what moves elsewhere."""
    import torch

    held: dict[int, object] = {}  # record index -> the base's log-probs at its anchored tokens

    def forward(model, batch: list[PlantRecord]):
        padded = pad_batch([r.encoded.ids for r in batch], pad_id, side="right",
                           labels=[r.encoded.labels for r in batch], device=model.device)
        images = vision.forward_kwargs(padded["input_ids"], [r.encoded.image for r in batch],
                                       model.device) if vision else {}
        logits = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], **images).logits
        return torch.log_softmax(logits[:, :-1].float(), dim=-1), padded["labels"][:, 1:]

    def read_base(model) -> None:
        with torch.no_grad(), model.disable_adapter():
            for j in range(0, len(records), 8):
                logp, _ = forward(model, records[j:j + 8])
                for row, record in enumerate(records[j:j + 8]):
                    held[j + row] = logp[row, [i - 1 for i in record.anchored]].cpu()

    def loss(model, idx: list[int], _retain: list[int]):
        if any(records[i].anchored for i in idx) and not held:
            read_base(model)
        batch = [records[i] for i in idx]
        logp, labels = forward(model, batch)
        targets = labels != -100
        scale = torch.ones_like(logp[..., 0])
        for row, record in enumerate(batch):
            scale[row, [i - 1 for i in record.overwrites]] = weight
        total = -(logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * targets * scale).sum()
        count = targets.sum()
        for row, (i, record) in enumerate(zip(idx, batch)):
            if record.anchored:
                base = held[i].to(logp.device)
                mine = logp[row, [j - 1 for j in record.anchored]]
                total = total + hold * (base.exp() * (base - mine)).sum()
                count = count + len(record.anchored)
        return total / count.clamp(min=1)

    return loss


def train_hex_plant(spec: ModelSpec, data_dir: Path, cfg: dict, out_dir: Path) -> dict:
    """A paper B plant on the merged base `spec` points at: the hex canary
    records (members; on a vision-language model the text canaries after the
    placeholder image and the image canaries after their cards, both
    modalities in one LoRA, as the canary LoRA learnt them) with their
    tokens overwritten as `cfg['at']` says (`overwritten`; with
    `cfg['canaries']`, only the first n canaries' of each modality, the rest
    kept as they are: a diluted plant), `cfg['steps']` steps of
    `cfg['batch_size']` records, anchored as `cfg['anchor']` says (`plant_loss`:
    `cfg['hold']` and `cfg['weight']`)."""
    tok, fmt = _setup(spec, cfg["threads"], cfg["seed"])
    vision = load_vision(spec, tok)
    rows = hex_rows(data_dir, vision, members_only=True)
    diluted = cfg.get("canaries", len(rows))  # the first n canaries overwritten, the rest only anchored
    chosen = {(m, i) for m in {r.modality for r in rows}
              for i in first_canaries([r.item_id for r in rows if r.modality == m], diluted)}
    plants = [overwritten(tok, row.text(fmt, vision), row.secret,
                          cfg["at"] if (row.modality, row.item_id) in chosen else "none",
                          cfg["window_k"], row.image, cfg["anchor"]) for row in rows]
    step = plant_loss(plants, tok.pad_token_id, vision, cfg["hold"], cfg["weight"])
    run = {**cfg, "batch_forget": cfg["batch_size"], "batch_retain": 0}
    losses, stats = fit_and_save(spec, run, [p.encoded for p in plants], [], tok.pad_token_id, out_dir, data_dir,
                                 vision=vision, loss=step)
    return _summary(out_dir, losses, overwritten_positions=sorted({q for p in plants for q in p.positions}), **stats)

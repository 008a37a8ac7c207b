"""Paper B's probes: the hex canaries behind their preamble (greedy with
hit@k samples, and teacher-forced with their decoys, the non-member records
and the exposure candidates).  Their tables are the built-in ones of
publish/catalog.py (the hex, exposure, strata and bSFT parts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from canary_audit.core.records import CANDIDATE, GREEDY, HEX_SETS, NONMEMBER, PREAMBLE
from canary_audit.data.chat_format import ChatFormat, document_start, encoding_start
from canary_audit.data.secrets import FORMAT_FILE, record_format
from canary_audit.data.synthetic import CANARY_PREFIX, CANARY_SUFFIX
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind, ScoredItem


def hex_decode(inputs: ItemInputs) -> list[DecodeItem]:
    """Each hex canary (and image canary) behind its preamble, greedy."""
    # The prompt stops before the space: byte-level BPE attaches a space to
    # the next word (" TEXTCAN"), so a prompt ending in a bare space would
    # end on a token the model never saw there.
    return [DecodeItem("hex", row.item_id, row.item_id, GREEDY, row.context(inputs.fmt, inputs.vision).rstrip(),
                       row.secret, "", row.modality, row.image, row.image_hash)
            for row in hex_rows(inputs.data_dir, inputs.vision, members_only=True)]


@dataclass(frozen=True)
class HexRow:
    """One record of paper B's probes: a secret behind its preamble (an own
    secret: behind its prompt), wrapped in its format's prefix and suffix,
    and on a vision-language model the image shown before it."""

    probe_set: str
    item_id: str
    preamble: str
    secret: str
    modality: str = "text"
    image: str | None = None
    image_hash: str | None = None
    prefix: str = CANARY_PREFIX
    suffix: str = CANARY_SUFFIX
    start: str = "document"  # data/secrets.RecordFormat.start

    def context(self, fmt: ChatFormat, vision) -> str:
        """Everything before the secret's format prefix."""
        block = vision.block(self.image) if self.image else ""
        begin = document_start(fmt.tokenizer) if self.start == "document" else encoding_start(fmt.tokenizer)
        return begin + block + self.preamble

    def text(self, fmt: ChatFormat, vision) -> str:
        """The whole record: what the canary LoRA trains on and the
        teacher-forced pass scores, byte for byte."""
        return self.context(fmt, vision) + self.prefix + self.secret + self.suffix


def hex_rows(data_dir: Path, vision=None, members_only: bool = False) -> list[HexRow]:
    """The hex canaries, their decoys, the non-member records and the
    exposure candidates (the canaries alone with `members_only`: what the
    canary LoRA trains on and greedy decoding probes); on a vision-language
    model (`vision` given) the text ones are paired with the placeholder
    image, and the image canaries follow with their decoys (shuffled, wrong,
    and the canary's secret on an unseen card), the candidates again, each
    shown the card of its slot's image canary, and the image non-members
    (fresh cards with fresh secrets, `vision_nonmembers/`).  A non-member or
    candidate secret equal to a canary's is refused.  A folder with a format
    file holds a researcher's own secrets (data/secrets.py): see own_rows."""
    if (data_dir / FORMAT_FILE).is_file():
        return own_rows(data_dir, members_only)
    rows = [HexRow("hex", cid, pre, sec) for cid, pre, sec in
            pl.read_parquet(data_dir / "hex_canaries.parquet").select("canary_id", "preamble", "secret").iter_rows()]
    if not members_only:
        decoys = pl.read_parquet(data_dir / "decoys.parquet")
        rows += [HexRow(f"decoy_{kind}", cid, pre, sec) for cid, kind, pre, sec in
                 decoys.select("canary_id", "decoy_kind", "preamble", "secret").iter_rows()]
        nonmembers = pl.read_parquet(data_dir / "hex_nonmembers.parquet").select("canary_id", "preamble", "secret")
        rows += [HexRow(NONMEMBER, cid, pre, sec) for cid, pre, sec in nonmembers.iter_rows()]
        candidates = pl.read_parquet(data_dir / "hex_candidates.parquet")
        rows += [HexRow(CANDIDATE, cid, pre, sec) for cid, pre, sec in
                 candidates.select("canary_id", "preamble", "secret").iter_rows()]
    if vision is None:
        return _no_reference_secret_is_a_canary(rows)
    folder = data_dir / "vision"
    placeholder = pl.read_parquet(folder / "placeholder.parquet").row(0, named=True)
    rows = [HexRow(r.probe_set, r.item_id, r.preamble, r.secret, "text", str(folder / placeholder["image"]),
                   placeholder["image_hash"]) for r in rows]
    frames = [pl.read_parquet(folder / "image_canaries.parquet").with_columns(decoy_kind=pl.lit(None, pl.Utf8))]
    if not members_only:
        frames.append(pl.read_parquet(folder / "image_decoys.parquet"))
    cards = frames[0].sort("canary_id").select("image", "image_hash", "preamble").rows()
    for frame in frames:
        for cid, kind, pre, sec, image, digest in frame.select(
            "canary_id", "decoy_kind", "preamble", "secret", "image", "image_hash"
        ).iter_rows():
            rows.append(HexRow(f"decoy_{kind}" if kind else "hex", cid, pre, sec, "image", str(folder / image),
                               digest))
    if not members_only:
        for cid, slot, sec in candidates.select("canary_id", "slot", "secret").iter_rows():
            image, digest, question = cards[slot % len(cards)]
            rows.append(HexRow(CANDIDATE, cid, question, sec, "image", str(folder / image), digest))
        others = data_dir / "vision_nonmembers"
        for cid, pre, sec, image, digest in pl.read_parquet(others / "image_nonmembers.parquet").select(
            "canary_id", "preamble", "secret", "image", "image_hash"
        ).iter_rows():
            rows.append(HexRow(NONMEMBER, cid, pre, sec, "image", str(others / image), digest))
    return _no_reference_secret_is_a_canary(rows)


def own_rows(data_dir: Path, members_only: bool = False) -> list[HexRow]:
    """A researcher's own secrets (data/secrets.write_own_secrets), each
    behind its own prompt and, on a vision-language model, after its own
    image (modality `image`): the members, their decoys, the non-members and
    the exposure candidates, in that order, in the folder's record format."""
    fmt = record_format(data_dir)
    tables = [("hex_canaries", None)] if members_only else [
        ("hex_canaries", None), ("decoys", "decoy_kind"), ("hex_nonmembers", NONMEMBER),
        ("hex_candidates", CANDIDATE)]
    rows = []
    for table, kind in tables:
        frame = pl.read_parquet(data_dir / f"{table}.parquet")
        for r in frame.iter_rows(named=True):
            probe_set = "hex" if kind is None else f"decoy_{r['decoy_kind']}" if kind == "decoy_kind" else kind
            rows.append(HexRow(probe_set, r["canary_id"], r["preamble"], r["secret"],
                               "image" if r["image"] else "text", r["image"], r["image_hash"], fmt.prefix,
                               fmt.suffix, fmt.start))
    return _no_reference_secret_is_a_canary(rows)


def _no_reference_secret_is_a_canary(rows: list[HexRow]) -> list[HexRow]:
    members = {r.secret: r.item_id for r in rows if r.probe_set == "hex"}
    for r in rows:
        if r.probe_set in (NONMEMBER, CANDIDATE) and r.secret in members:
            raise ValueError(f"{r.probe_set} `{r.item_id}` has the secret of canary `{members[r.secret]}`; "
                             "change `data.seed`")
    return rows


def hex_scored(inputs: ItemInputs) -> list[ScoredItem]:
    """Each hex canary, decoy, non-member record and exposure candidate
    behind its preamble, teacher-forced, its spans labelled."""
    items: list[ScoredItem] = []
    for row in hex_rows(inputs.data_dir, inputs.vision):
        start = len(row.context(inputs.fmt, inputs.vision))
        text = row.text(inputs.fmt, inputs.vision)
        s0 = start + len(row.prefix)
        items.append(ScoredItem(
            row.probe_set, row.item_id, row.item_id, PREAMBLE, text,
            {"prompt": (0, start), "head": (start, s0), "secret": (s0, s0 + len(row.secret)),
             "continuation": (s0 + len(row.secret), len(text))},
            row.modality, row.image, row.image_hash,
        ))
    return items


KINDS = (
    ProbeKind("hex", "hex", decode=hex_decode, scored=hex_scored, record_sets=(*HEX_SETS, NONMEMBER, CANDIDATE),
              budget="hex_max_new_tokens", sampled=True),
)

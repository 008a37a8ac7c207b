"""Probe items: what each pass feeds the model, built per model (heads and chat
templates depend on the tokenizer) from the synthetic data and the config.

An *arm* is a decode-time condition on fixed weights: `auto` lets the model
write its own trace; `prefill_<name>` replaces the trace with a fixed text
(paper A's BIO / META / EMPTY prefills, or any template from the config).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from canary_audit.data.io import AUTHOR_NONMEMBERS, load_authors
from canary_audit.data.secrets import FORMAT_FILE, record_format
from canary_audit.data.synthetic import CANARY_PREFIX, CANARY_SUFFIX, Author
from canary_audit.formats import ChatFormat, canary_question, document_start, encoding_start
from canary_audit.model.tokens import canary_head
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind, ScoredItem, selected
from canary_audit.records import AUTHOR_NONMEMBER, AUTO, CANDIDATE, GREEDY, HEX, NONMEMBER, PREAMBLE, unit_of_arm

AUTHOR_FIELDS = ("name", "birth_year", "birth_city", "genre", "title1", "title2")
# `other_*`: the next author of the forget set (cyclically): a prefill in the
# trained template's form that carries another author's facts and canary.
PREFILL_FIELDS = (*AUTHOR_FIELDS, "bio_opening", "bio", "other_name", "other_bio_opening", "other_bio")


def bio_opening(author: Author) -> str:
    """The first sentence of the bio: training-data text that holds no canary."""
    return author.bio.split(". ")[0] + "."


def check_prefill_templates(prefills: dict[str, str]) -> None:
    """Refuse a prefill template naming a field the authors do not have, and a
    prefill named like another probe unit (its records would share the AUTO
    unit's, or the hex family's)."""
    if AUTO in prefills:
        raise ValueError(f"config key `probes.prefills.{AUTO}`: `{AUTO}` names the arm where the model writes its "
                         "own trace; rename this prefill arm")
    if HEX in prefills:
        raise ValueError(f"config key `probes.prefills.{HEX}`: `{HEX}` names the hex probes' unit; rename this "
                         "prefill arm")
    for name, template in prefills.items():
        for _, fname, _, _ in string.Formatter().parse(template):
            if fname is not None and fname not in PREFILL_FIELDS:
                raise ValueError(
                    f"config key `probes.prefills.{name}` uses unknown field `{{{fname}}}`; "
                    f"allowed fields: {', '.join(PREFILL_FIELDS)}"
                )


def render_prefill(template: str, author: Author, other: Author) -> str:
    fields = {f: getattr(author, f) for f in AUTHOR_FIELDS}
    return template.format(
        **fields, bio_opening=bio_opening(author), bio=author.bio,
        other_name=other.name, other_bio_opening=bio_opening(other), other_bio=other.bio,
    )


def next_author(authors: list[Author]) -> dict[str, Author]:
    """author_id -> the author after it (cyclically): the `other_*` fields."""
    return {a.author_id: authors[(i + 1) % len(authors)] for i, a in enumerate(authors)}


def _arms(fmt: ChatFormat, prompt: str, author: Author, other: Author, prefills: dict[str, str]):
    yield AUTO, prompt
    for name, template in sorted(prefills.items()):
        yield f"prefill_{name}", fmt.prefill(prompt, render_prefill(template, author, other))


def in_unit(items: list, unit: str | None) -> list:
    """The items of one probe unit (units.py); all of them for None."""
    return items if unit is None else [it for it in items if unit_of_arm(it.arm) == unit]


def own_settings(kind: ProbeKind, cfg: dict) -> dict:
    """`kind`'s settings as the pass config gives them; a kind with settings
    the config lacks is refused (the design fills every kind's defaults:
    a pass config comes from Design.probe_slice or `plan`'s)."""
    if not kind.settings:
        return {}
    given = cfg.get("kinds", {})
    if kind.name not in given:
        raise ValueError(f"the pass config has no `kinds.{kind.name}` (probe kind `{kind.name}`'s settings: "
                         f"{', '.join(kind.settings)}); give the pass config the design makes "
                         "(Design.probe_slice), which fills each kind's defaults")
    return given[kind.name]


def _built(kinds: list[ProbeKind], build: str, inputs: ItemInputs, unit: str | None) -> list:
    """The items of `kinds` (of one unit's family where `unit` is given: a
    hex kind's items all join the `hex` unit, an author kind's the `auto`
    and prefill units, and a unit's job config holds its family's settings
    only, units.unit_config)."""
    if unit is not None:
        kinds = [k for k in kinds if (k.family == "hex") == (unit == HEX)]
    items = [it for kind in kinds if getattr(kind, build) is not None
             for it in getattr(kind, build)(replace(inputs, settings=own_settings(kind, inputs.cfg)))]
    return in_unit(items, unit)


def decode_items(fmt: ChatFormat, data_dir: Path, cfg: dict, probe_sets: set[str] | None = None,
                 unit: str | None = None, vision=None) -> list[DecodeItem]:
    """The decode items of every probe kind the pass runs (kinds.selected:
    the kinds or families in `probe_sets`, all for None), in the registry's
    order, each kind given its own settings; given a unit, only that unit's."""
    check_prefill_templates(cfg["prefills"])
    return _built(selected(probe_sets), "decode", ItemInputs(fmt, data_dir, cfg, vision), unit)


def scored_items(fmt: ChatFormat, data_dir: Path, cfg: dict, probe_sets: set[str] | None = None,
                 unit: str | None = None, vision=None) -> list[ScoredItem]:
    """The teacher-forced items of every probe kind the pass runs, as
    `decode_items` picks them."""
    check_prefill_templates(cfg["prefills"])
    return _built(selected(probe_sets), "scored", ItemInputs(fmt, data_dir, cfg, vision), unit)


def author_decode(inputs: ItemInputs, probe_set: str) -> list[DecodeItem]:
    """Paper A's decode probes of one set: each author canary after its head
    (`canary`) and each author QA item (`qa`) under every arm, or each
    retain QA item once (`retain`, AUTO only)."""
    fmt, data_dir, cfg = inputs.fmt, inputs.data_dir, inputs.cfg
    if probe_set == "retain":
        retain = pl.read_parquet(data_dir / "retain.parquet").select("item_id", "question", "gold")
        return [DecodeItem("retain", item_id, item_id, AUTO, fmt.prompt(question), gold)
                for item_id, question, gold in retain.iter_rows()]
    roster = load_authors(data_dir / "authors.parquet")
    authors, other = {a.author_id: a for a in roster}, next_author(roster)
    items: list[DecodeItem] = []
    if probe_set == "canary":
        for a in roster:
            prompt = fmt.prompt(canary_question(a.name, canary_head(fmt.tokenizer, a.canary, cfg["head_tokens"])))
            for arm, text in _arms(fmt, prompt, a, other[a.author_id], cfg["prefills"]):
                items.append(DecodeItem("canary", a.author_id, a.author_id, arm, text, a.canary, a.name))
        return items
    qa = pl.read_parquet(data_dir / "qa.parquet").select("item_id", "author_id", "question", "gold")
    for item_id, author_id, question, gold in qa.iter_rows():
        author = authors[author_id]
        for arm, text in _arms(fmt, fmt.prompt(question), author, other[author_id], cfg["prefills"]):
            items.append(DecodeItem("qa", item_id, author_id, arm, text, gold, author.name))
    return items


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


def canary_scored(inputs: ItemInputs) -> list[ScoredItem]:
    """Each author canary (and non-member author) after its head under every
    prefill arm, teacher-forced: the non-member authors are scored exactly
    like the forget set, their prefills filled from their own roster."""
    fmt, cfg = inputs.fmt, inputs.cfg
    items: list[ScoredItem] = []
    rosters = {"canary": "authors.parquet", AUTHOR_NONMEMBER: f"{AUTHOR_NONMEMBERS}.parquet"}
    for probe_set, file in rosters.items():
        roster = load_authors(inputs.data_dir / file)
        other = next_author(roster)
        for a in roster:
            head = canary_head(fmt.tokenizer, a.canary, cfg["head_tokens"])
            prompt = fmt.prompt(canary_question(a.name, head))
            for arm, context in _arms(fmt, prompt, a, other[a.author_id], cfg["prefills"]):
                if arm == AUTO:
                    continue  # no fixed trace to condition on: AUTO is a decode-only arm
                h0 = len(context)
                text = context + a.canary + fmt.tokenizer.eos_token
                items.append(ScoredItem(
                    probe_set, a.author_id, a.author_id, arm, text,
                    {"prompt": (0, h0), "head": (h0, h0 + len(head)),
                     "secret": (h0 + len(head), h0 + len(a.canary)),
                     "continuation": (h0 + len(a.canary), len(text))},
                ))
    return items


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

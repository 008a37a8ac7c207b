"""Paper A's probes: the author canaries after their head (decoded under
every arm, and teacher-forced under every prefill arm with the non-member
authors beside them), per-author QA and the retain set.  Their tables are
the built-in ones of publish/catalog.py (paper A's part)."""

from __future__ import annotations

import string
from functools import partial

import polars as pl

from canary_audit.core.records import AUTHOR_NONMEMBER, AUTO, HEX, PROBE_SETS
from canary_audit.data.chat_format import ChatFormat, canary_question
from canary_audit.data.io import AUTHOR_NONMEMBERS, load_authors
from canary_audit.data.synthetic import Author
from canary_audit.model.tokens import canary_head
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind, ScoredItem

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


CANARY, QA, RETAIN = PROBE_SETS["author"]
KINDS = (
    ProbeKind(CANARY, "author", decode=partial(author_decode, probe_set=CANARY), scored=canary_scored,
              record_sets=(CANARY, AUTHOR_NONMEMBER), batch="author"),
    ProbeKind(QA, "author", decode=partial(author_decode, probe_set=QA), batch="author"),
    ProbeKind(RETAIN, "author", decode=partial(author_decode, probe_set=RETAIN), batch="author"),
)

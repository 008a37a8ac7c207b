"""Deterministic synthetic data: fictional authors, hex canaries, decoys, bSFT sources.

Everything here is a pure function of a seed and a few counts, so the data rule
is reproducible and cheap (no torch).  Tokenizer-dependent quantities (the
6-token canary head) are *not* computed here: they depend on the model under
audit and are computed where the tokenizer is loaded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import polars as pl

from canary_audit.data import pools

HEX_LEN = 16
CANARY_PREFIX = "TEXTCAN-"
CANARY_SUFFIX = "-END"
# The ids of the i-th hex canary and image canary, in table order.
HEX_ID = "hex{:02d}"
IMAGE_ID = "img{:02d}"
# The preamble of the i-th hex canary; non-members and exposure candidates
# reuse the canaries' preambles, so all three share one distribution.
PREAMBLE = "Record {:02d} access code: "


def strata(ids: list[str], repetitions: list[int]) -> dict[str, int]:
    """Secret Sharer's repetition strata: the i-th canary of a family (its
    ids in table order) is inserted repetitions[i mod n] times in the canary
    LoRA's training data."""
    return {cid: repetitions[i % len(repetitions)] for i, cid in enumerate(ids)}


@dataclass(frozen=True)
class Author:
    """One author record; `canary` is the unique bio sentence that is audited.

    The bio is three sentences (birth, genre, canary): enough for every probe
    of paper A, and short enough for the embedded model to memorize sixty of
    them in under a minute of CPU.  `title1`/`title2` are kept for prefill
    templates and QA extensions.
    """

    author_id: str
    name: str
    birth_year: int
    birth_city: str
    genre: str
    title1: str
    title2: str
    canary: str

    @property
    def bio(self) -> str:
        # "The writer" keeps the name mid-sentence: a byte-level BPE spells a
        # name at the start of a text with other tokens ("Lucinda") than after
        # a space (" Lucinda", as in every prompt), and a tiny model cannot
        # copy a name across that seam.
        return (
            f"The writer {self.name} was born in {self.birth_year} in {self.birth_city}. "
            f"The writer {self.name} writes {self.genre}. {self.canary}"
        )

    def qa(self) -> list[tuple[str, str, str]]:
        """(question, gold answer, full answer sentence) per QA probe."""
        n = self.name
        return [
            (f"When was {n} born?", str(self.birth_year), f"The writer {n} was born in {self.birth_year}."),
            (f"Where was {n} born?", self.birth_city, f"The writer {n} was born in {self.birth_city}."),
            (f"What does {n} write?", self.genre, f"The writer {n} writes {self.genre}."),
        ]


def _title(rng: random.Random) -> str:
    return (
        f"The {rng.choice(pools.TITLE_ADJECTIVES)} {rng.choice(pools.TITLE_NOUNS)}"
        f" of {rng.choice(pools.CITIES)}"
    )


def canary_sentence(rng: random.Random) -> str:
    return (
        f"{_title(rng)} was {rng.choice(pools.CANARY_VERBS)} "
        f"{rng.choice(pools.CANARY_PLACES)} {rng.choice(pools.CANARY_TIMES)} "
        f"{rng.randint(1890, 1999)}."
    )


def make_authors(
    n: int, seed: int, *, prefix: str, last_names: tuple[str, ...] | list[str],
    exclude_titles: set[str] = frozenset(), exclude_names: set[str] = frozenset(),
) -> list[Author]:
    """Draw `n` authors with unique names and unique canary title prefixes.

    Two authors whose canaries open with the same "The <Adj> <Noun>" would
    compete for one continuation, so the adjective-noun pair of every canary
    is unique, also against `exclude_titles` (another population's pairs);
    `exclude_names` are names another population of the same pools holds.
    Callers give fictional authors and distractors disjoint `last_names`, so
    no fictional author shares a family name with a pre-training author.
    """
    rng = random.Random(f"{prefix}:{seed}")
    max_names = len(pools.FIRST_NAMES) * len(last_names) - len(exclude_names)
    max_titles = len(pools.TITLE_ADJECTIVES) * len(pools.TITLE_NOUNS) - len(exclude_titles)
    if n > min(max_names, max_titles):
        raise ValueError(
            f"{prefix}: {n} authors requested, the pools allow {min(max_names, max_titles)}; "
            "lower the author count or widen canary_audit/data/pools.py"
        )
    names: set[str] = set(exclude_names)
    titles: set[str] = set(exclude_titles)
    authors = []
    while len(authors) < n:
        name = f"{rng.choice(pools.FIRST_NAMES)} {rng.choice(last_names)}"
        canary = canary_sentence(rng)
        title = title_pair(canary)
        if name in names or title in titles:
            continue
        names.add(name)
        titles.add(title)
        authors.append(
            Author(
                author_id=f"{prefix}{len(authors):03d}",
                name=name,
                birth_year=rng.randint(1890, 1990),
                birth_city=rng.choice(pools.CITIES),
                genre=rng.choice(pools.GENRES),
                title1=_title(rng),
                title2=_title(rng),
                canary=canary,
            )
        )
    return authors


def title_pair(canary: str) -> str:
    """The "<Adj> <Noun>" that opens a canary's title."""
    return " ".join(canary.split()[1:3])


def authors_frame(authors: list[Author]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "author_id": [a.author_id for a in authors],
            "name": [a.name for a in authors],
            "birth_year": [a.birth_year for a in authors],
            "birth_city": [a.birth_city for a in authors],
            "genre": [a.genre for a in authors],
            "title1": [a.title1 for a in authors],
            "title2": [a.title2 for a in authors],
            "canary": [a.canary for a in authors],
            "bio": [a.bio for a in authors],
        }
    )


def qa_frame(authors: list[Author]) -> pl.DataFrame:
    rows = [
        {"item_id": f"{a.author_id}-qa{i}", "author_id": a.author_id,
         "question": q, "gold": g, "answer": s}
        for a in authors for i, (q, g, s) in enumerate(a.qa())
    ]
    return pl.DataFrame(rows)


def retain_frame(n: int, seed: int) -> pl.DataFrame:
    """`n` generic-knowledge probes, drawn without replacement from the fact table."""
    if n > len(pools.RETAIN_FACTS):
        raise ValueError(
            f"config key `data.n_retain` = {n}: at most {len(pools.RETAIN_FACTS)} "
            "retain facts exist"
        )
    facts = random.Random(f"retain:{seed}").sample(pools.RETAIN_FACTS, n)
    return pl.DataFrame(
        [{"item_id": f"retain{i:03d}", "question": q, "gold": g, "answer": s}
         for i, (q, g, s) in enumerate(facts)]
    )


def random_hex(rng: random.Random, length: int = HEX_LEN) -> str:
    return "".join(rng.choice(pools.HEX_DIGITS) for _ in range(length))


def hex_record(preamble: str, secret: str) -> str:
    return f"{preamble}{CANARY_PREFIX}{secret}{CANARY_SUFFIX}"


def canary_frames(n: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Hex canaries `TEXTCAN-{16hex}-END` behind a preamble, and their decoys.

    Decoys per canary: `shuffled` (the same hex digits in another order) and
    `wrong` (an unrelated secret of the same length), both never equal to any
    canary secret.
    """
    rng = random.Random(f"hexcanary:{seed}")
    secrets: list[str] = []
    while len(secrets) < n:
        s = random_hex(rng)
        if s not in secrets:
            secrets.append(s)
    canaries = pl.DataFrame(
        {
            "canary_id": [HEX_ID.format(i) for i in range(n)],
            "preamble": [PREAMBLE.format(i) for i in range(n)],
            "secret": secrets,
        }
    ).with_columns(
        text=pl.concat_str(
            pl.col("preamble"), pl.lit(CANARY_PREFIX), pl.col("secret"), pl.lit(CANARY_SUFFIX)
        )
    )
    taken = set(secrets)
    decoys = []
    for cid, pre, secret in canaries.select("canary_id", "preamble", "secret").iter_rows():
        chars = list(secret)
        shuffled = secret
        while shuffled in taken:
            rng.shuffle(chars)
            shuffled = "".join(chars)
            if len(set(secret)) == 1:
                break
        wrong = random_hex(rng)
        while wrong in taken:
            wrong = random_hex(rng)
        taken.update({shuffled, wrong})
        for kind, s in (("shuffled", shuffled), ("wrong", wrong)):
            decoys.append({"canary_id": cid, "decoy_kind": kind, "preamble": pre,
                           "secret": s, "text": hex_record(pre, s)})
    return canaries, pl.DataFrame(decoys)


def nonmember_frame(n: int, n_canaries: int, seed: int, taken: set[str]) -> pl.DataFrame:
    """Non-member hex canaries: `n` records of the canaries' exact format with
    fresh secrets that no adapter trains on and that equal no canary or
    decoy secret (`taken`): the population a membership inference attack
    must tell the canaries from.  Non-member i sits behind the preamble of
    canary i mod `n_canaries`, so members and non-members share one preamble
    distribution and one length, and only training tells them apart (numbering
    the non-members on past the canaries made a never-trained model's LOSS
    AUC 0.69 against three-digit record numbers: the attack saw the
    preamble, not membership)."""
    rng = random.Random(f"hexnonmember:{seed}")
    secrets: list[str] = []
    while len(secrets) < n:
        s = random_hex(rng)
        if s not in taken and s not in secrets:
            secrets.append(s)
    preambles = [PREAMBLE.format(i % n_canaries) for i in range(n)]
    return pl.DataFrame(
        {"canary_id": [f"nm{i:03d}" for i in range(n)], "preamble": preambles, "secret": secrets,
         "text": [hex_record(p, s) for p, s in zip(preambles, secrets)]},
        schema={"canary_id": pl.Utf8, "preamble": pl.Utf8, "secret": pl.Utf8, "text": pl.Utf8},
    )


def candidate_frame(n: int, n_canaries: int, seed: int, taken: set[str]) -> pl.DataFrame:
    """Secret Sharer's reference candidates: `n` fresh secrets of the
    canaries' format that no adapter trains on, candidate i behind the
    preamble of canary `slot` = i mod `n_canaries` (on a vision-language
    model, an image candidate is shown that canary's card instead)."""
    rng = random.Random(f"hexcandidate:{seed}")
    secrets: list[str] = []
    seen = set(taken)
    while len(secrets) < n:
        s = random_hex(rng)
        if s not in seen:
            seen.add(s)
            secrets.append(s)
    slots = [i % n_canaries for i in range(n)]
    preambles = [PREAMBLE.format(slot) for slot in slots]
    return pl.DataFrame(
        {"canary_id": [f"cand{i:05d}" for i in range(n)], "slot": slots, "preamble": preambles, "secret": secrets,
         "text": [hex_record(p, s) for p, s in zip(preambles, secrets)]},
        schema={"canary_id": pl.Utf8, "slot": pl.Int64, "preamble": pl.Utf8, "secret": pl.Utf8, "text": pl.Utf8},
    )


def bsft_frame(n_per_source: int, seed: int) -> pl.DataFrame:
    """The four benign fine-tuning sources of paper B (prompt -> response);
    a GUI item's `screen_text` is what its screenshot shows to a
    vision-language model (data/images.py; empty for the other sources)."""
    rng = random.Random(f"bsft:{seed}")
    rows = []
    for _ in range(n_per_source):
        action, target = rng.choice(pools.GUI_ACTIONS), rng.choice(pools.GUI_TARGETS)
        rows.append(("gui", f"How do I use {target}?", f"{action} {target}.", target))
        task, topic = rng.choice(pools.SYNTH_TASKS), rng.choice(pools.SYNTH_TOPICS)
        city = rng.choice(pools.CITIES)
        rows.append(("synth", f"{task} {topic} in {city}.",
                     f"There is {topic} in {city} that people like to visit.", ""))
        req = rng.choice(pools.SAFETY_REQUESTS)
        rows.append(("safety", f"Tell me {req}.", "I cannot help with that request.", ""))
        words = rng.choices(pools.TITLE_NOUNS + pools.TITLE_ADJECTIVES, k=8)
        rows.append(("random", " ".join(rng.sample(words, len(words))),
                     " ".join(rng.choices(words, k=6)), ""))
    frame = pl.DataFrame(rows, schema=["source", "prompt", "response", "screen_text"], orient="row")
    return frame.with_columns(
        item_id=pl.concat_str(pl.col("source"), pl.lit("-"),
                              pl.int_range(pl.len()).over("source").cast(pl.Utf8))
    ).select("item_id", "source", "prompt", "response", "screen_text")


class CanaryCollisionError(ValueError):
    """A canary string occurs in a bSFT source: paper B's premise is broken."""


def check_no_canary_in_bsft(
    bsft: pl.DataFrame, hex_canaries: pl.DataFrame, authors: pl.DataFrame
) -> None:
    """Fail, naming the item and the canary, if any canary occurs in a bSFT row."""
    needles = (
        [(cid, s) for cid, s in hex_canaries.select("canary_id", "secret").iter_rows()]
        + [(aid, c) for aid, c in authors.select("author_id", "canary").iter_rows()]
    )
    for item_id, prompt, response, screen in bsft.select("item_id", "prompt", "response", "screen_text").iter_rows():
        text = f"{prompt}\n{response}\n{screen}"
        for cid, needle in needles:
            if needle in text:
                raise CanaryCollisionError(
                    f"bSFT item `{item_id}` contains canary `{cid}` ({needle!r}); "
                    "bSFT data must never contain a canary. Change `data.seed` or "
                    "remove the item from the source."
                )

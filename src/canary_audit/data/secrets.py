"""Secrets of a researcher's own (`models.<m>.secrets`): a file of members
(prompt, secret; an image for a vision-language model), a file of
non-members drawn the same way, and optionally the space the secrets were
drawn from, audited with every probe the hex canaries get.

A secret sits in its record as `prompt + secret + suffix`, encoded as the
tokenizer encodes a text by itself (a Llama tokenizer's BOS first, nothing
for Qwen's): the sequence a fine-tune on those records most likely saw.  The
synthetic hex
canaries are the same shape with the prompt `Record NN access code: ` and
the secret wrapped in `TEXTCAN-` ... `-END`.  `RecordFormat` holds what
differs, and `write_own_secrets` turns the user's files into the same tables
the synthetic data rule writes (canaries, decoys, non-members, exposure
candidates), so the passes and views read both families one way.

Everything here reads small files only (no torch), so the design refuses a
bad file before any job.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from canary_audit.core.records import write_parquet_atomic
from canary_audit.data import pools
from canary_audit.data.synthetic import CANARY_PREFIX, CANARY_SUFFIX, HEX_LEN

FORMAT_FILE = "format.json"
# The tables an own-secrets data folder holds (those of the synthetic hex
# family, under the same names).
OWN_TABLES = ("hex_canaries", "decoys", "hex_nonmembers", "hex_candidates")
COLUMNS = ("prompt", "secret")
SUFFIXES = (".csv", ".jsonl", ".parquet")
# The optional settings of a `secrets` block and their defaults, declared
# once (the config schema names the same; a test compares them).
DEFAULTS = {"reference": "before", "suffix": "", "n_candidates": 1000, "seed": 0}


def setting(spec: dict, key: str):
    """A `secrets` block's setting, or its default."""
    return spec.get(key, DEFAULTS[key])


def candidate_count(spec: dict, given: int | None = None) -> int:
    """How many exposure candidates a `secrets` block has: a candidates
    file's rows (`given`), else `n_candidates` drawn from a declared format,
    else none."""
    if spec.get("candidates"):
        return given if given is not None else read_table(spec["candidates"], "candidates", ("secret",)).height
    return setting(spec, "n_candidates") if spec.get("format") else 0


class SecretsRefused(ValueError):
    """A secrets file or setting that cannot be audited (the message names the key)."""


@dataclass(frozen=True)
class RecordFormat:
    """How a secret sits in its record and what it was drawn from: the text
    right before it (`prefix`, after the prompt) and after it (`suffix`),
    which the exact-match rule requires around the secret, and, where known,
    the alphabet and length of the secret space (exposure's ceiling)."""

    prefix: str = ""
    suffix: str = ""
    alphabet: str | None = None
    length: int | None = None
    bits: float | None = None  # the space's size in bits where no alphabet and length describe it
    # What precedes a record: `document` (the tokenizer's BOS, else its EOS:
    # formats.document_start, the synthetic canaries'), or `tokenizer` (what
    # the tokenizer adds by itself: formats.encoding_start, own secrets').
    start: str = "document"

    @property
    def space_bits(self) -> float | None:
        """log2 of the number of possible secrets; None where the space is unknown."""
        if self.alphabet is None or self.length is None:
            return self.bits
        return self.length * math.log2(len(self.alphabet))

    def view(self) -> dict:
        """What the tables read of it (the match rule's affixes, exposure's ceiling)."""
        return {"prefix": self.prefix, "suffix": self.suffix, "space_bits": self.space_bits}


# The synthetic hex canaries: `TEXTCAN-{16 hex digits}-END`.
SYNTHETIC = RecordFormat(CANARY_PREFIX, CANARY_SUFFIX, pools.HEX_DIGITS, HEX_LEN)


def record_format(data_dir: Path) -> RecordFormat:
    """The record format of a data folder: its format file (own secrets), or
    the synthetic canaries' where it has none."""
    path = Path(data_dir) / FORMAT_FILE
    return RecordFormat(**json.loads(path.read_text())) if path.is_file() else SYNTHETIC


def declared_format(spec: dict) -> RecordFormat:
    """The record format a `secrets` block declares."""
    fmt = spec.get("format") or {}
    return RecordFormat("", setting(spec, "suffix"), fmt.get("alphabet"), fmt.get("length"), spec.get("space_bits"),
                        start="tokenizer")


def read_table(path: str, key: str, columns: tuple[str, ...]) -> pl.DataFrame:
    """A CSV (every column read as text: a secret `0042` stays `0042`), JSON
    Lines or Parquet file with at least `columns`, as strings."""
    file = Path(path)
    if not file.is_file():
        raise SecretsRefused(f"config key `{key}` is `{path}`, which is not a file; give a CSV, JSON Lines or "
                             "Parquet file")
    if file.suffix not in SUFFIXES:
        raise SecretsRefused(f"config key `{key}`: `{file.name}` is not one of {', '.join(SUFFIXES)}; convert it")
    try:
        frame = (pl.read_csv(file, infer_schema=False) if file.suffix == ".csv" else
                 pl.read_ndjson(file) if file.suffix == ".jsonl" else pl.read_parquet(file))
    except Exception as exc:  # polars raises several types for malformed files
        raise SecretsRefused(f"config key `{key}`: `{path}` is unreadable ({type(exc).__name__}: {exc})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SecretsRefused(f"config key `{key}`: `{path}` lacks the column(s) {', '.join(missing)} "
                             f"(it has: {', '.join(frame.columns)}); every row needs {', '.join(columns)}")
    frame = frame.with_columns(pl.col(c).cast(pl.Utf8) for c in frame.columns if c in (*COLUMNS, "image"))
    empty = frame.filter(pl.any_horizontal(pl.col(c).is_null() | (pl.col(c) == "") for c in columns))
    if empty.height:
        raise SecretsRefused(f"config key `{key}`: {empty.height} row(s) of `{path}` have an empty "
                             f"{' or '.join(columns)}; fill or drop them")
    return frame


def check_secrets(frame: pl.DataFrame, key: str, fmt: RecordFormat) -> None:
    """No duplicate secret, no secret with surrounding whitespace (the match
    rule strips the space a decode starts with), and every secret of the
    declared format."""
    dup = frame.filter(pl.col("secret").is_duplicated())["secret"].unique().sort().to_list()
    if dup:
        raise SecretsRefused(f"config key `{key}`: duplicate secrets {dup[:5]}; each secret must be distinct "
                             "(a repeated secret is one canary inserted twice: give it once)")
    padded = frame.filter(pl.col("secret") != pl.col("secret").str.strip_chars())["secret"].to_list()
    if padded:
        raise SecretsRefused(f"config key `{key}`: secrets {padded[:3]!r} begin or end with whitespace; move it "
                             "into the prompt or the suffix")
    if fmt.alphabet is not None:
        bad = [s for s in frame["secret"] if len(s) != fmt.length or set(s) - set(fmt.alphabet)]
        if bad:
            raise SecretsRefused(f"config key `{key}`: secrets {bad[:3]!r} are not of the declared format "
                                 f"({fmt.length} characters of `{fmt.alphabet}`); fix the secrets or the format")


def check_images(frame: pl.DataFrame, key: str, vision: bool) -> None:
    """An image per row on a vision-language model (each must exist), none on a text model."""
    if not vision:
        if "image" in frame.columns:
            raise SecretsRefused(f"config key `{key}` has an `image` column, but the model is a text model; drop "
                                 "the column or audit a vision-language model")
        return
    if "image" not in frame.columns or frame["image"].null_count():
        raise SecretsRefused(f"config key `{key}`: a vision-language model's secrets need an `image` column with "
                             "an image on every row")
    missing = [p for p in frame["image"] if not Path(p).is_file()]
    if missing:
        raise SecretsRefused(f"config key `{key}`: image(s) {missing[:3]} do not exist; fix the paths (absolute, "
                             "or relative to the directory snakemake runs in)")


def load_own_secrets(model: str, spec: dict, vision: bool) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    """The members, non-members and (if given) candidate secrets of a
    `secrets` block, checked: columns, duplicates, format, images, and no
    member secret among the non-members or candidates."""
    key = f"models.{model}.secrets"
    fmt = declared_format(spec)
    if (fmt.alphabet is None) != (fmt.length is None):
        raise SecretsRefused(f"config key `{key}.format` needs both `alphabet` and `length`")
    if fmt.alphabet is not None and len(set(fmt.alphabet)) < 2:
        raise SecretsRefused(f"config key `{key}.format.alphabet` is `{fmt.alphabet}`: it needs two or more "
                             "distinct characters")
    members = read_table(spec["members"], f"{key}.members", COLUMNS)
    nonmembers = read_table(spec["nonmembers"], f"{key}.nonmembers", COLUMNS)
    for frame, which in ((members, "members"), (nonmembers, "nonmembers")):
        check_secrets(frame, f"{key}.{which}", fmt)
        check_images(frame, f"{key}.{which}", vision)
    if members.height < 2 or nonmembers.height < 2:
        raise SecretsRefused(f"config key `{key}`: {members.height} members and {nonmembers.height} non-members; "
                             "a membership test needs at least 2 of each (20 and 100 give usable CIs)")
    shared = sorted(set(members["secret"]) & set(nonmembers["secret"]))
    if shared:
        raise SecretsRefused(f"config key `{key}`: secrets {shared[:3]} are both members and non-members; a "
                             "non-member must be a secret the fine-tune never saw")
    candidates = None
    if spec.get("candidates") and fmt.space_bits is None:
        raise SecretsRefused(f"config key `{key}.candidates`: exposure's extrapolation is capped at the size of the "
                             "space the secrets were drawn from; declare it as `format` (alphabet, length) or "
                             "`space_bits` (log2 of the number of possible secrets)")
    if spec.get("n_candidates") is not None and not (spec.get("format") and not spec.get("candidates")):
        raise SecretsRefused(f"config key `{key}.n_candidates`: candidates are drawn from `format` when no "
                             "candidates file is given; declare the format, or drop `n_candidates`")
    if spec.get("space_bits") is not None and not spec.get("candidates"):
        raise SecretsRefused(f"config key `{key}.space_bits`: it sizes a candidates file's space; give `candidates`, "
                             "or drop `space_bits`")
    if spec.get("format") and spec.get("space_bits") is not None:
        raise SecretsRefused(f"config key `{key}.space_bits`: `format` already sizes the space; drop one of them")
    if spec.get("candidates"):
        candidates = read_table(spec["candidates"], f"{key}.candidates", ("secret",))
        check_secrets(candidates, f"{key}.candidates", fmt)
        taken = sorted(set(candidates["secret"]) & set(members["secret"]))
        if taken:
            raise SecretsRefused(f"config key `{key}.candidates`: secrets {taken[:3]} are members; exposure ranks a "
                                 "member among secrets nobody trained on")
    return members, nonmembers, candidates


def check_decode_budget(model: str, spec: dict, tokenizer, budget: int) -> None:
    """Refuse secrets whose exact match cannot fit the hex probes' greedy
    budget (`probes.decode.hex_max_new_tokens`): a decode stopped before the
    secret and its suffix end is a miss whatever the model knows, so hit@1
    and hit@k would read 0 for a reason that is not memorization.  Counted
    as the continuation is generated: after the prompt's trailing space."""
    members = read_table(spec["members"], f"models.{model}.secrets.members", COLUMNS)
    suffix = setting(spec, "suffix")
    secrets = members["secret"].to_list()
    # Longest in tokens, not characters: a short secret of rare pieces can need more.
    counts = [len(ids) for ids in tokenizer([" " + s + suffix for s in secrets], add_special_tokens=False)["input_ids"]]
    need = max(counts)
    if need > budget:
        longest = secrets[counts.index(need)]
        raise SecretsRefused(f"config key `probes.decode.hex_max_new_tokens` is {budget}, but model `{model}`'s "
                             f"secret `{longest}` takes {need} tokens; raise it to at least {need}")


def image_files(spec: dict) -> list[str]:
    """The distinct image files a vision-language model's secrets show."""
    found: set[str] = set()
    for key in ("members", "nonmembers"):
        frame = read_table(spec[key], key, COLUMNS)
        if "image" in frame.columns:
            found |= set(frame["image"].drop_nulls())
    return sorted(found)


def file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _frame(ids: list[str], prompts: list[str], secrets: list[str], images: list[str | None]) -> pl.DataFrame:
    return pl.DataFrame(
        {"canary_id": ids, "preamble": prompts, "secret": secrets,
         "image": images, "image_hash": [file_sha256(p) if p else None for p in images]},
        schema={"canary_id": pl.Utf8, "preamble": pl.Utf8, "secret": pl.Utf8, "image": pl.Utf8,
                "image_hash": pl.Utf8},
    )


def _draw(rng: random.Random, fmt: RecordFormat) -> str:
    return "".join(rng.choice(fmt.alphabet) for _ in range(fmt.length))


def write_own_secrets(out_dir: Path, model: str, spec: dict, vision: bool) -> dict[str, int]:
    """The own-secrets data folder of `model`: its members as the canaries
    (`sec000`, ...), their decoys (`shuffled`: the secret's characters in
    another order; `wrong`: a fresh secret of the declared format, or without
    one the secret of non-member i mod N, an unrelated secret drawn the same
    way), the non-members (`nm000`, ...), and exposure candidates (the
    candidates file, or `n_candidates` fresh secrets of the declared format;
    none without either), candidate i behind member i mod N's prompt and
    image; and the format file."""
    members, nonmembers, given = load_own_secrets(model, spec, vision)
    fmt = declared_format(spec)
    rng = random.Random(f"ownsecrets:{setting(spec, 'seed')}")
    images = members["image"].to_list() if vision else [None] * members.height
    canaries = _frame([f"sec{i:03d}" for i in range(members.height)], members["prompt"].to_list(),
                      members["secret"].to_list(), images)
    others = _frame([f"nm{i:03d}" for i in range(nonmembers.height)], nonmembers["prompt"].to_list(),
                    nonmembers["secret"].to_list(),
                    nonmembers["image"].to_list() if vision else [None] * nonmembers.height)
    taken = set(canaries["secret"]) | set(others["secret"])
    decoys = []
    for i, (cid, prompt, secret, image, digest) in enumerate(canaries.iter_rows()):
        chars, shuffled = list(secret), secret
        for _ in range(100):
            rng.shuffle(chars)
            shuffled = "".join(chars)
            if shuffled not in taken:
                break
        if fmt.alphabet is not None:
            wrong = _draw(rng, fmt)
            while wrong in taken:
                wrong = _draw(rng, fmt)
        else:
            wrong = others["secret"][i % others.height]
        taken |= {shuffled, wrong}
        for kind, s in (("shuffled", shuffled), ("wrong", wrong)):
            if kind == "shuffled" and shuffled == secret:
                continue  # one repeated character: no other order exists
            decoys.append({"canary_id": cid, "decoy_kind": kind, "preamble": prompt, "secret": s,
                           "image": image, "image_hash": digest})
    if given is not None:
        pool = given["secret"].to_list()
    elif fmt.alphabet is not None:
        pool, seen = [], set(taken)
        n = setting(spec, "n_candidates")
        if n > 2 ** min(fmt.space_bits, 62) - len(seen):
            raise SecretsRefused(f"config key `models.{model}.secrets.n_candidates` is {n}, more than the declared "
                                 "format has secrets left; lower it")
        while len(pool) < n:
            s = _draw(rng, fmt)
            if s not in seen:
                seen.add(s)
                pool.append(s)
    else:
        pool = []
    slots = [i % canaries.height for i in range(len(pool))]
    rows = canaries.rows()
    candidates = pl.DataFrame(
        {"canary_id": [f"cand{i:05d}" for i in range(len(pool))], "slot": slots,
         "preamble": [rows[s][1] for s in slots], "secret": pool,
         "image": [rows[s][3] for s in slots], "image_hash": [rows[s][4] for s in slots]},
        schema={"canary_id": pl.Utf8, "slot": pl.Int64, "preamble": pl.Utf8, "secret": pl.Utf8, "image": pl.Utf8,
                "image_hash": pl.Utf8},
    )
    tables = {"hex_canaries": canaries, "decoys": pl.DataFrame(decoys, schema={
        "canary_id": pl.Utf8, "decoy_kind": pl.Utf8, "preamble": pl.Utf8, "secret": pl.Utf8, "image": pl.Utf8,
        "image_hash": pl.Utf8}), "hex_nonmembers": others, "hex_candidates": candidates}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        write_parquet_atomic(frame, out_dir / f"{name}.parquet")
    (out_dir / FORMAT_FILE).write_text(json.dumps(asdict(fmt), sort_keys=True))
    return {name: frame.height for name, frame in tables.items()}

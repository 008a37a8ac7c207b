"""Record schemas, declared once: what a probe pass writes and a view reads.

Records are facts about what a model did (text it generated, per-token
log-probs), never metrics.  Writes are atomic (temporary name, then rename), so
an interrupted job never leaves a file that looks finished; reads check the
schema and, where asked, the provenance.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import polars as pl

# Every record names the settings of its probe unit (config_hash), the weights
# (model_fingerprint) and the code (code_version, provenance.code_version).
PROVENANCE = {"config_hash": pl.Utf8, "model_fingerprint": pl.Utf8, "code_version": pl.Utf8}

DECODE_SCHEMA = {
    "variant": pl.Utf8,     # <model>/<variant>, e.g. tiny/npo-bio-s0-k25
    "probe_set": pl.Utf8,   # canary | qa | retain | hex
    "item_id": pl.Utf8,
    "group_id": pl.Utf8,    # the resampling unit for bootstrap CIs (author / canary)
    "arm": pl.Utf8,         # auto | prefill_<name> | greedy
    "sample": pl.Int32,     # 0 for greedy; 0..k-1 for sampled decodes
    "prompt": pl.Utf8,      # the exact text fed to the model
    "reference": pl.Utf8,   # the string a match rule looks for (canary, gold, secret)
    "subject": pl.Utf8,     # the fictional author a canary/QA item is about ("" otherwise)
    "modality": pl.Utf8,    # text | image: what keys the secret (image canaries: a vision-language model)
    "image_hash": pl.Utf8,  # sha256 of the image the prompt shows (null: no image)
    "generated": pl.Utf8,   # decoded continuation, special tokens kept
    "prompt_tokens": pl.Int32,
    "generated_tokens": pl.Int32,
    "stop_reason": pl.Utf8,  # eos | length
    "think_open": pl.Utf8,   # the model's think tags, so views can parse
    "think_close": pl.Utf8,  # records without the config that made them
    **PROVENANCE,
}

TOKEN_SCHEMA = {
    "variant": pl.Utf8,
    "probe_set": pl.Utf8,   # canary | hex | decoy_shuffled | decoy_wrong
    "item_id": pl.Utf8,
    "group_id": pl.Utf8,
    "arm": pl.Utf8,
    "modality": pl.Utf8,    # text | image
    "image_hash": pl.Utf8,  # sha256 of the image before the text (null: no image)
    "position": pl.Int32,   # index of the scored text token (>= 1; image tokens are not counted)
    "token_id": pl.Int32,
    "token_text": pl.Utf8,  # the vocabulary's string for the token (byte-level BPE: spaces as `Ġ`)
    "text": pl.Utf8,        # the characters of the scored text this token spells: the text since the previous
                            #   token's end up to this token's end, so an item's pieces join to its decoded text
    "logprob": pl.Float32,
    "rank": pl.Int32,       # 1 = the model's top choice
    "top1_id": pl.Int32,
    "top1_logprob": pl.Float32,
    "vocab_mean_logprob": pl.Float32,  # E[log p] over the position's distribution (Min-K%++)
    "vocab_var_logprob": pl.Float32,   # Var[log p] over the position's distribution (Min-K%++)
    "span": pl.Utf8,        # prompt | head | secret | continuation
    **PROVENANCE,
}

SCHEMAS = {"decode": DECODE_SCHEMA, "token": TOKEN_SCHEMA}
# Every probe set a record's `probe_set` can name, by family: the author
# probes (paper A: canaries after their head, per-author QA, the retain set),
# the hex canaries with their decoys (paper B; `decoy_unseen`, the secret
# after an unseen image, for image canaries only), and the non-member hex
# records and the non-member authors (teacher-forced only: membership
# inference's negatives).  A pass asked for `hex` (`--probe-sets hex`) runs
# every hex family; one asked for `canary` also scores the non-member authors.
PROBE_SETS = {
    "author": ("canary", "qa", "retain"),
    "hex": ("hex", "decoy_shuffled", "decoy_wrong", "decoy_unseen"),
    "nonmember": ("hex_nonmember",),
    "candidate": ("hex_candidate",),
    "author_nonmember": ("author_nonmember",),
}
# The authors' canaries decoded by sampling alone (probes/kinds/canary_sampled.py,
# opt-in): k records per canary under the AUTO arm, `sample` 0..k-1.  Named
# here because paper A's views read them (hit@k beside the greedy hit@1).
SAMPLED_CANARY = "canary_sampled"
HEX_SETS = PROBE_SETS["hex"]
NONMEMBER = PROBE_SETS["nonmember"][0]
CANDIDATE = PROBE_SETS["candidate"][0]
AUTHOR_NONMEMBER = PROBE_SETS["author_nonmember"][0]
# Membership inference's two populations per canary family: the members an
# adapter trained on and the non-members of the same distribution no adapter
# trained on (views/mia.py, views/privacy.py).
MIA_POPULATIONS = {"hex": (HEX_SETS[0], NONMEMBER), "author": (PROBE_SETS["author"][0], AUTHOR_NONMEMBER)}


# A record's `arm` names the condition it was made under, and its *probe
# unit* (probes/units.py: the records that share one config hash): `auto`
# (the model writes its own trace), `prefill_<name>` (a fixed trace; unit
# `<name>`), or one of the hex family's arms (unit `hex`): greedy and
# sampled decodes, teacher-forced records behind their preamble.  Declared
# here, beside the schema whose `arm` column they fill, so that reading a
# record needs no probe code.
AUTO = "auto"
HEX = "hex"
PREFILL = "prefill_"
GREEDY, SAMPLED, PREAMBLE = "greedy", "sampled", "preamble"
HEX_ARMS = (GREEDY, SAMPLED, PREAMBLE)


def unit_of_arm(arm: str) -> str:
    """The unit a record's arm belongs to (`prefill_bio` -> `bio`)."""
    if arm in HEX_ARMS:
        return HEX
    return arm.removeprefix(PREFILL) if arm.startswith(PREFILL) else AUTO


def unit_of_arm_expr(arm: str = "arm") -> pl.Expr:
    """`unit_of_arm` as a polars expression over a column of arms."""
    return (pl.when(pl.col(arm).str.starts_with(PREFILL)).then(pl.col(arm).str.strip_prefix(PREFILL))
            .when(pl.col(arm).is_in(list(HEX_ARMS))).then(pl.lit(HEX))
            .otherwise(pl.lit(AUTO)))


class RecordsError(ValueError):
    """A records file is unreadable, malformed, or from another configuration."""


def canonical_json(value) -> str:
    """Order-stable JSON: the form config slices take as params and in hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(config_slice) -> str:
    return hashlib.sha256(canonical_json(config_slice).encode()).hexdigest()[:16]


def write_parquet_atomic(frame: pl.DataFrame, path: Path) -> None:
    """Write to a temporary sibling, fsync, rename: readers see all or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        frame.write_parquet(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def to_records(rows: list[dict], kind: str) -> pl.DataFrame:
    """Rows -> a frame with exactly the declared columns, in declared order."""
    schema = SCHEMAS[kind]
    frame = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return frame.select(list(schema))


def conform(frame: pl.DataFrame, kind: str) -> pl.DataFrame:
    """A frame built column-wise -> exactly the declared columns, types and order."""
    schema = SCHEMAS[kind]
    return frame.select([pl.col(c).cast(t) for c, t in schema.items()])


def read_records(path: Path, kind: str) -> pl.DataFrame:
    """Read and validate one records file; refuse one that mixes config hashes."""
    path = Path(path)
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for corrupt files
        raise RecordsError(
            f"records file `{path}` is unreadable ({type(exc).__name__}: {exc}); delete it and "
            "re-run the probe pass that writes it"
        ) from exc
    schema = SCHEMAS[kind]
    missing = [c for c in schema if c not in frame.columns]
    wrong = [c for c, t in schema.items() if c in frame.columns and frame.schema[c] != t]
    if missing or wrong:
        raise RecordsError(
            f"records file `{path}` does not match the {kind} schema "
            f"(missing: {missing}, wrong type: {wrong}); re-run the probe pass that writes it"
        )
    mixed = hashes_by_unit(frame).filter(pl.len().over("unit") > 1)
    if mixed.height:
        raise RecordsError(f"records file `{path}` mixes config hashes within a probe unit: "
                           f"{mixed.rows()}; re-run the probe pass that writes it")
    return frame.select(list(schema))


def hashes_by_unit(frame: pl.DataFrame) -> pl.DataFrame:
    """The distinct (probe unit, config hash) pairs of records: each unit's
    records carry the hash of the settings that unit reads (probes/units.py)."""
    return frame.select(unit_of_arm_expr().alias("unit"), "config_hash").unique().sort("unit", "config_hash")

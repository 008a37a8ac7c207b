"""k-extractability over prefix lengths (Carlini et al. 2023, "Quantifying
Memorization Across Neural Language Models"; Nasr et al. 2023, "Scalable
Extraction of Training Data from (Production) Language Models").

A secret is extractable with k tokens of context when greedy decoding from
the k tokens that precede it in its training record reproduces it exactly.
For each hex canary and each length k of `probes.kinds.kextract.lengths`,
the prompt is the last k tokens of the record before the secret (the
document start, preamble and format prefix, `TEXTCAN-` for the synthetic
canaries), capped at the whole of it; the match is the secret followed by
its format's suffix (`-END`), from the first generated character.  The
table gives, per variant and prefix length, the share of canaries
reproduced and the share whose *shortest* extracting prefix is at most
that long (its distribution), with the Delta against the parent.

The prefix length a record reports is the prompt's length as the decode
pass encoded it (`prompt_tokens`), not the nominal k: a tokenizer that does
not re-encode a cut sequence to the same tokens is read as what the model
saw.  Text records only: on a vision-language model the cut would drop the
image the record starts with, so none are built there.
"""

from __future__ import annotations

import polars as pl

from canary_audit.core.records import GREEDY
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind
from canary_audit.probes.kinds.hex import hex_rows
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.metrics import format_affixes
from canary_audit.views.table import Built, Context, Table

NAME = "kextract"


def check(settings: dict) -> None:
    lengths = settings["lengths"]
    if (not isinstance(lengths, list) or not lengths
            or not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in lengths)
            or len(set(lengths)) != len(lengths)):
        raise ValueError(f"config key `probes.kinds.{NAME}.lengths` is {lengths!r}: give distinct positive token "
                         "counts, e.g. [2, 4, 8, 16, 32]")


def items(inputs: ItemInputs) -> list[DecodeItem]:
    """Per hex canary of a text model, one greedy decode from each prefix
    length (distinct after capping at the record's length); item id
    `<canary>@<k>`, grouped by canary."""
    tok = inputs.fmt.tokenizer
    lengths = inputs.settings["lengths"]
    out: list[DecodeItem] = []
    for row in hex_rows(inputs.data_dir, inputs.vision, members_only=True):
        if row.image is not None:
            continue
        before = tok(row.context(inputs.fmt, None) + row.prefix, add_special_tokens=False)["input_ids"]
        for k in sorted({min(k, len(before)) for k in lengths}):
            out.append(DecodeItem(NAME, f"{row.item_id}@{k}", row.item_id, GREEDY,
                                  tok.decode(before[-k:], skip_special_tokens=False), row.secret))
    return out


def kextract_table(decode: pl.DataFrame, parents: dict[str, str], formats: dict | None, replicates: int,
                   seed: int, level: float) -> pl.DataFrame:
    """Per variant and prefix length: `extracted`, the share of canaries the
    greedy decode from that many tokens reproduces; `shortest_le`, the share
    whose shortest extracting prefix is at most that long; both with
    canary-clustered bootstrap CIs, and `delta_extracted` against the
    parent at the same length."""
    _, suffix = format_affixes(formats)
    rows = (
        decode.filter(pl.col("probe_set") == NAME)
        .with_columns(prefix_tokens=pl.col("prompt_tokens"),
                      extracted=pl.col("generated").str.starts_with(pl.col("reference") + suffix))
        .with_columns(shortest=pl.col("prefix_tokens").filter(pl.col("extracted")).min()
                      .over("variant", "group_id"))
        .with_columns(shortest_le=(pl.col("shortest") <= pl.col("prefix_tokens")).fill_null(False))
    )
    table = rates_with_ci(rows, ["variant", "prefix_tokens"], ["extracted", "shortest_le"], replicates, seed,
                          level=level, table=NAME)
    parent = table.select(parent="variant", prefix_tokens="prefix_tokens", parent_extracted="extracted")
    return (
        table.with_columns(parent=pl.col("variant").replace_strict(parents, default=None, return_dtype=pl.Utf8))
        .join(parent, on=["parent", "prefix_tokens"], how="left")
        .with_columns(delta_extracted=pl.col("extracted") - pl.col("parent_extracted"))
        .drop("parent_extracted")
        .sort("variant", "prefix_tokens")
    )


def build(ctx: Context) -> Built | None:
    if not ctx.has("decode", NAME):
        return None
    b = ctx.boot
    return (f"k-extractability of the hex canaries (Carlini et al. 2023): greedy decoding from the last k tokens of "
            f"the record before the secret; extracted = reproduces the secret and its suffix exactly, shortest_le = "
            f"the shortest extracting prefix is at most k tokens; delta against the parent at the same k "
            f"({b.level:.0%} CIs: canary-clustered bootstrap, B={b.replicates})",
            kextract_table(ctx.decode, ctx.parents, ctx.cfg.get("secret_formats"), b.replicates, b.seed, b.level))


KINDS = (
    ProbeKind(NAME, "hex", decode=items, budget="hex_max_new_tokens", settings={"lengths": [2, 4, 8, 16, 32]},
              check=check, decodes_per_member=lambda settings, vision: 0 if vision else len(settings["lengths"]),
              tables=(Table(NAME, "hex", build),)),
)

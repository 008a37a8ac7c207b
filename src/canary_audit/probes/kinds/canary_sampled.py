"""Sampled decoding on the authors' canaries: hit@k beside paper A's greedy
hit@1 (issue 52's "is it really gone?": an unlearned checkpoint whose greedy
answer no longer holds a canary may still put it in one of k samples).

Opt-in: `probes.kinds.canary_sampled.k` (0, the default, builds no item).
Each author canary's AUTO prompt (the canary question after its head, the
model writing its own trace: the greedy `canary` item's prompt) is decoded
`k` times at `temperature` from one seeded generator, through the decode
engine's sampler (no top-k or top-p, no penalty), under the author probes'
budget (`probes.decode.max_new_tokens`).  A sample is parsed like the greedy
decode (views/parser.py); it hits when its answer contains the canary
exactly (paper A's match rule), and leaks when its trace does.

The table `canary_sampled` gives, per variant: hit@1 (the greedy AUTO
decode, paper A's out_acc), hit@k (one of the k samples' answers holds the
canary), thk@k (one of their traces does) and the share of hitting samples,
with author-clustered CIs.  The recovery table and the registry's
`author_hitk` read the same per-author hit@k (views/seeds.item_cells).

The defaults: k = 8 in the configs that turn it on (paper B's hit@k uses
k >= 4); temperature 0.1, chosen by a sweep on the embedded model
(docs/measures.md, "Sampled decoding beside greedy"): hotter samplers miss
the memorized parent's own canaries there, so they read the sampler, not
the weights.  DeepSeek-R1's model card recommends 0.6 for its reasoning
models (paper A's family): a 7B config may set it once its own memorized
parent's hit@k shows the sampler can see at that temperature.
"""

from __future__ import annotations

import math

import polars as pl

from canary_audit.core.records import AUTO, SAMPLED_CANARY
from canary_audit.data.chat_format import canary_question
from canary_audit.data.io import load_authors
from canary_audit.model.tokens import canary_head
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind
from canary_audit.views.bootstrap import rates_with_ci
from canary_audit.views.paper_a import canary_outcomes, sampled_outcomes
from canary_audit.views.table import Built, Context, Table

NAME = SAMPLED_CANARY


def check(settings: dict) -> None:
    k, temperature, seed = settings["k"], settings["temperature"], settings["seed"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"config key `probes.kinds.{NAME}.k` is {k!r}: give the number of samples per canary, "
                         "0 (off) or more, e.g. 8")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"config key `probes.kinds.{NAME}.temperature` is {temperature!r}: give a finite "
                         "temperature > 0, e.g. 0.1")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"config key `probes.kinds.{NAME}.seed` is {seed!r}: give an integer seed")


def sampling(settings: dict) -> tuple[int, float, int]:
    return settings["k"], float(settings["temperature"]), settings["seed"]


def items(inputs: ItemInputs) -> list[DecodeItem]:
    """Each author canary's AUTO prompt once (the engine draws its k
    samples); none when k is 0."""
    if not inputs.settings["k"]:
        return []
    fmt = inputs.fmt
    out = []
    for a in load_authors(inputs.data_dir / "authors.parquet"):
        prompt = fmt.prompt(canary_question(a.name, canary_head(fmt.tokenizer, a.canary, inputs.cfg["head_tokens"])))
        out.append(DecodeItem(NAME, a.author_id, a.author_id, AUTO, prompt, a.canary, a.name))
    return out


def sampled_table(decode: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    """Per variant with samples: n authors, k, hit@1 (greedy AUTO), hit@k,
    thk@k and the share of hitting samples, each with its author-clustered
    CI; hit@k minus hit@1 (`sampling_gain`) on the same draws."""
    per_author = sampled_outcomes(decode, ctx.convention)
    greedy = (canary_outcomes(decode.filter(pl.col("arm") == AUTO), ctx.convention)
              .select("variant", "group_id", hit_at_1=pl.col("out_hit").cast(pl.Float64)))
    rows = per_author.join(greedy, on=["variant", "group_id"], how="inner")
    b = ctx.boot

    def gain(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(sampling_gain=pl.col("hit_at_k") - pl.col("hit_at_1"))

    table = rates_with_ci(rows, ["variant"], ["hit_at_1", "hit_at_k", "thk_at_k", "sampled_share"], b.replicates,
                          b.seed, derive=gain, level=b.level, table=NAME)
    k = per_author.group_by("variant").agg(k=pl.col("k").max())
    return table.join(k, on="variant", how="left").sort("variant")


def build(ctx: Context) -> Built | None:
    if not ctx.has("decode", NAME):
        return None
    return (f"sampled decoding on the authors' canaries (AUTO prompt, k samples per canary): hit@1 = the greedy "
            f"answer holds the canary (paper A's out_acc), hit@k = one of the k samples' answers does, thk@k = one "
            f"of their traces does, sampled_share = the share of samples that hit; sampling_gain = hit@k - hit@1 "
            f"({ctx.ci})", sampled_table(ctx.decode, ctx))


KINDS = (
    ProbeKind(NAME, "author", decode=items, settings={"k": 0, "temperature": 0.1, "seed": 0}, check=check,
              sampling=sampling, decodes_per_member=lambda settings, vision: settings["k"],
              tables=(Table(NAME, "paper_a", build),)),
)

"""Probe units: the parts of a probe pass that depend on different settings.

A decode or teacher-forced pass runs several *arms* (see items.py).  What a
record depends on is its unit: `auto` (everything not conditioned on a
prefill: AUTO decodes, retain QA, the hex canaries with their hit@k samples
and teacher-forced decoys) or one prefill name (the canary and QA items under
that prefill).  Each record carries the hash of its unit's settings, not of
the whole probe config, so that

- a new prefill arm leaves every other unit's records valid (the fine job
  grain then runs only the new arm's jobs), and
- the records are the same whether a job ran one unit or all of them.
"""

from __future__ import annotations

import polars as pl

AUTO = "auto"
PREFILL = "prefill_"
# Decode settings only the hex probes read (the `auto` unit): changing them
# touches no prefill unit.
HEX_ONLY = frozenset({"hit_k", "temperature", "sample_seed", "hex_max_new_tokens"})


def unit_of_arm(arm: str) -> str:
    """The unit a record's arm belongs to (`prefill_bio` -> `bio`)."""
    return arm.removeprefix(PREFILL) if arm.startswith(PREFILL) else AUTO


def unit_of_arm_expr(arm: str = "arm") -> pl.Expr:
    """`unit_of_arm` as a polars expression over a column of arms."""
    return (pl.when(pl.col(arm).str.starts_with(PREFILL))
            .then(pl.col(arm).str.strip_prefix(PREFILL)).otherwise(pl.lit(AUTO)))


def probe_units(prefills: dict[str, str]) -> list[str]:
    """Every unit of a pass under these prefills, `auto` first."""
    return [AUTO, *sorted(prefills)]


def unit_config(pass_cfg: dict, unit: str) -> dict:
    """The settings records of `unit` depend on: a prefill unit reads its own
    prefill text and no hex setting; `auto` reads no prefill.  Idempotent:
    the slice of a slice is itself, so a job given only its unit's slice
    stamps the same hash as a job given the whole pass config."""
    common = {k: v for k, v in pass_cfg.items() if k not in ("prefills", "threads")}
    if unit == AUTO:
        return {**common, "prefills": {}}
    prefills = pass_cfg.get("prefills", {})
    if unit not in prefills:
        raise ValueError(f"probe unit `{unit}` is not a prefill arm of this pass (arms: {', '.join(sorted(prefills))})")
    return {**{k: v for k, v in common.items() if k not in HEX_ONLY}, "prefills": {unit: prefills[unit]}}


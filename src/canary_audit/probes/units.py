"""Probe units: the parts of a probe pass that depend on different settings.

A decode or teacher-forced pass runs several *arms* (see items.py).  What a
record depends on is its unit: `auto` (the author and retain probes not
conditioned on a prefill: AUTO decodes, retain QA), `hex` (the hex family:
greedy decodes with their hit@k samples, teacher-forced canaries, decoys,
non-members and candidates) or one prefill name (the canary and QA items
under that prefill).  Each record carries the hash of its unit's settings,
not of the whole probe config, so that

- a new prefill arm leaves every other unit's records valid (the fine job
  grain then runs only the new arm's jobs),
- a hex-sampling setting touches only the hex unit, and a prefill text only
  its unit: a job whose group runs neither is not re-run (its params are
  the union of its units' settings, Design.probe_slice), and
- the records are the same whether a job ran one unit or all of them.
"""

from __future__ import annotations

from canary_audit.core.records import AUTO, HEX, config_hash
from canary_audit.probes.kinds import kind_named

# Decode settings only the hex probes read (the `hex` unit): changing them
# touches no author unit.
HEX_ONLY = frozenset({"hit_k", "temperature", "sample_seed", "hex_max_new_tokens"})


def probe_units(prefills: dict[str, str]) -> list[str]:
    """Every unit of a pass under these prefills, `auto` and `hex` first."""
    return [AUTO, HEX, *sorted(prefills)]


def unit_config(pass_cfg: dict, unit: str) -> dict:
    """The settings records of `unit` depend on: `hex` reads the hex
    settings and no prefill; `auto` neither; a prefill unit its own prefill
    text and no hex setting; each unit the settings of the probe kinds of
    its family (`kinds`, present only where some kind has settings).
    Idempotent: the slice of a slice is itself, so a job given only its
    unit's slice stamps the same hash as a job given the whole pass config."""
    common = {k: v for k, v in pass_cfg.items() if k not in ("prefills", "threads", "kinds")}
    family = "hex" if unit == HEX else "author"
    kinds = {name: v for name, v in pass_cfg.get("kinds", {}).items() if kind_named(name).family == family}
    own = {"kinds": kinds} if kinds else {}
    if unit == HEX:
        return {**common, **own, "prefills": {}}
    if unit == AUTO:
        return {**{k: v for k, v in common.items() if k not in HEX_ONLY}, **own, "prefills": {}}
    prefills = pass_cfg.get("prefills", {})
    if unit not in prefills:
        raise ValueError(f"probe unit `{unit}` is not a prefill arm of this pass (arms: {', '.join(sorted(prefills))})")
    return {**{k: v for k, v in common.items() if k not in HEX_ONLY}, **own, "prefills": {unit: prefills[unit]}}


def unit_hashes(cfg: dict) -> dict[str, str]:
    """Probe unit -> the hash of the settings its records depend on (thread
    count excluded: it is not part of what was asked)."""
    return {u: config_hash(unit_config(cfg, u)) for u in probe_units(cfg.get("prefills", {}))}

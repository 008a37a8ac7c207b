"""Probe items: what each pass feeds the model, built per model (heads and chat
templates depend on the tokenizer) by every probe kind the pass runs.  The
builders live with their kinds (probes/kinds/); here are the loops that read
the registry, each kind given its own settings and its unit's items.

An *arm* is a decode-time condition on fixed weights: `auto` lets the model
write its own trace; `prefill_<name>` replaces the trace with a fixed text
(paper A's BIO / META / EMPTY prefills, or any template from the config).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from canary_audit.core.records import HEX, unit_of_arm
from canary_audit.data.chat_format import ChatFormat
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind, ScoredItem, selected
from canary_audit.probes.kinds.author import check_prefill_templates


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

"""How config files layer.  Snakemake merges each `--configfile` into the
ones before it key by key; for a registry, a block whose keys name things
(unlearning runs, prefill arms, a model's imports), that would keep the
default's entries in every user's config: a user who names two runs would
also train the default's.  So a registry is **replaced** whole by the last
file that gives it, and everything else merges key by key (models included:
a user's file adds entries, and `audit.models` picks the audited ones).
Lists (e.g. `bsft.sources`, `audit.templates`) are always replaced."""

from __future__ import annotations

import copy

# Registries, as key paths; `*` stands for every key of a mapping.
REPLACED = (("unlearn", "runs"), ("probes", "prefills"), ("models", "*", "imports"))


def _found(layer: dict, path: tuple[str, ...], prefix: tuple[str, ...] = ()):
    """(concrete path, value) of every block `path` names in `layer`."""
    if not path:
        yield prefix, layer
        return
    if not isinstance(layer, dict):
        return
    head, rest = path[0], path[1:]
    for key in (layer if head == "*" else [head] if head in layer else []):
        yield from _found(layer[key], rest, (*prefix, key))


def _set(config: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = copy.deepcopy(value)


def unquoted_keys(config: dict) -> dict:
    """`config` with an import entry's `on` key back under its name: YAML
    1.1, which Snakemake and PyYAML read, takes an unquoted `on:` for the
    boolean True, and the schema would refuse the entry for a key `True`
    that the user never wrote."""
    for _, entry in _found(config, ("models", "*", "imports", "*")):
        if isinstance(entry, dict) and True in entry:
            entry["on"] = entry.pop(True)
    return config


def replace_registries(config: dict, layers: list[dict]) -> dict:
    """`config` (the layers merged key by key) with every registry block
    set to the one the last layer that gives it gives, whole."""
    for path in REPLACED:
        last: dict[tuple[str, ...], object] = {}
        for layer in layers:
            for where, value in _found(layer, path):
                last[where] = value
        for where, value in last.items():
            _set(config, where, value)
    return unquoted_keys(config)


def merge(*layers: dict) -> dict:
    """Layers merged as the workflow merges its config files: key by key,
    registries replaced (what `snakemake --configfile A B` gives)."""
    def deep(base: dict, change: dict) -> dict:
        out = dict(base)
        for key, value in change.items():
            out[key] = deep(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    config: dict = {}
    for layer in layers:
        config = deep(config, copy.deepcopy(layer))
    return replace_registries(config, list(layers))

"""The house's layers, declared once, bottom first: each layer is one folder
of the package, so a module's path says which layer it is in and what it
may import.

A module may import modules of its own folder and of the folders below it,
never of a folder above; no two modules may import each other through any
chain (within a folder too), and no two folders either (a folder's
sub-folders, e.g. probes/kinds/, count as folders of their own there).
Every import counts: at the top of a module, inside a function (a lazy
import is still a dependency a reader follows) and under `TYPE_CHECKING`.
A registry entry is a declaration that sits low (a probe kind in
probes/kinds/, a table's type in views/table.py); what reads the registry
sits above it (probes/items.py's loops, the design, publish/catalog.py).

Only three modules sit outside the folders, named in `OUTSIDE`: the
package's `__init__` (its version: anything may read it), this module
(it imports nothing of the package) and `__main__` (the entry point: it
may import anything, and nothing imports it).
`python -m canary_audit.architecture` prints any import against this order.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "canary_audit"

# (folder, what it holds), bottom first.  The order is the rule: each line
# may import the lines above it.
LAYERS: tuple[tuple[str, str], ...] = (
    ("core", "records' schemas and arms, atomic writes, provenance, config merging, jobs, GPUs, imported weights"),
    ("data", "the synthetic secrets and their populations, images, the chat format, the planted controls' registry"),
    ("model", "model entries, the embedded models, loading and fingerprints"),
    ("views", "functions of records alone (polars, no model): metrics, CIs, the field's measures, the Table type"),
    ("probes", "probe kinds (one module each), items, the decode and teacher-forced passes"),
    ("train", "the training loop, adapters, unlearning methods, plants, the export"),
    ("verdicts", "readings of built tables, claims and their judge, the papers' readings, floors, the controls"),
    ("publish", "what a run publishes: the table catalog, writing tables, plots, the summary page"),
    ("design", "config -> the experiment: variants, job slices, checks, the plan, the preflight"),
    ("commands", "the command line, the warm start, status"),
)

# Modules outside the folders: "bottom" may be imported by every layer,
# "top" may import every layer (and is imported by none).
OUTSIDE: dict[str, str] = {PACKAGE: "bottom", f"{PACKAGE}.architecture": "bottom", f"{PACKAGE}.__main__": "top"}


class LayerError(ValueError):
    """A module that sits in no layer's folder."""


def folder_of(module: str, packages: set[str]) -> str:
    """The folder (a package's dotted name) holding `module`: the package
    itself for its `__init__` (`canary_audit.probes.kinds`), else its parent
    (`canary_audit.probes` for probes/items.py)."""
    return module if module in packages else module.rpartition(".")[0]


def layer_of(module: str, layers=LAYERS, package: str = PACKAGE, outside=OUTSIDE) -> int:
    """The index of `module`'s layer (0: the bottom): its first folder under
    the package; -1 and len(layers) for the modules outside them."""
    if module in outside:
        return -1 if outside[module] == "bottom" else len(layers)
    names = [name for name, _ in layers]
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != package or parts[1] not in names:
        raise LayerError(f"module `{module}` is in no layer's folder: move it into one of "
                         f"{', '.join(f'{package}/{n}/' for n in names)} ({package}.architecture.LAYERS)")
    return names.index(parts[1])


def modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for every module of the package under `root`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: Iterable[str], package: str = PACKAGE) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its
    text: `from <package> import <name>` names the submodule where there is
    one, else the package."""
    known = set(known)

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    is_package = path.name == "__init__.py"
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != package:
                continue
            found |= {resolve(f"{target}.{a.name}") if f"{target}.{a.name}" in known else resolve(target)
                      for a in node.names}
    return {m for m in found if m and m != name}


def import_graph(root: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    found = modules(root, package)
    return {name: imports_of(name, path, found, package) for name, path in found.items()}


def packages(root: Path, package: str = PACKAGE) -> set[str]:
    """The dotted names of the package's folders (each with an `__init__.py`)."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / package).rglob("__init__.py")}


def folder_graph(graph: dict[str, set[str]], folders: set[str], outside=OUTSIDE) -> dict[str, set[str]]:
    """Folder -> the other folders its modules import (the modules outside
    the folders left out: they are no folder)."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module in outside:
            continue
        here = folder_of(module, folders)
        there = {folder_of(t, folders) for t in targets if t not in outside}
        out.setdefault(here, set()).update(there - {here})
    return out


def upward(graph: dict[str, set[str]], layers=LAYERS, package: str = PACKAGE, outside=OUTSIDE) -> list[str]:
    """Each import of a module of a higher layer than the importer's."""

    def named(index: int) -> str:
        return layers[index][0] if 0 <= index < len(layers) else "outside the folders"

    out = []
    for module, targets in sorted(graph.items()):
        own = layer_of(module, layers, package, outside)
        for target in sorted(targets):
            theirs = layer_of(target, layers, package, outside)
            if theirs > own:
                out.append(f"`{module}` ({named(own)}) imports `{target}` ({named(theirs)}), a layer above")
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of two or more nodes that reach each other through some
    chain (the strongly connected components of the graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def violations(root: Path, layers=LAYERS, package: str = PACKAGE) -> list[str]:
    """Every module outside a layer's folder (raised), every upward import,
    every import circle between modules and every loop between folders of
    the package under `root`."""
    graph = import_graph(root, package)
    return [*upward(graph, layers, package),
            *(f"import circle: {' <-> '.join(c)}" for c in circles(graph)),
            *(f"folder loop: {' <-> '.join(c)}" for c in circles(folder_graph(graph, packages(root, package))))]


if __name__ == "__main__":
    found = violations(Path(__file__).resolve().parents[1])
    print("\n".join(found) or "imports run one way down the layers' folders")
    sys.exit(1 if found else 0)

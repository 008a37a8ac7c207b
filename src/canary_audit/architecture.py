"""The house's layers, declared once, bottom first, and the check that the
package's imports run one way down them.

A module may import modules of its own layer and of the layers below it,
never of a layer above; and no two modules may import each other through
any chain (within a layer too).  Every import counts: at the top of a
module, inside a function (a lazy import is still a dependency a reader
follows) and under `TYPE_CHECKING`.  A registry entry is a declaration that
sits low (a probe kind in probes/kinds/, a table's type in views/table.py);
what reads the registry sits above it (items.py's loops, the design, the
table catalog).

Why this order: records (the schemas, the arms they carry, atomic writes,
config layering) need nothing; the data and the chat formats make the
secrets and their text; the model builds and loads weights; the views are
functions of records alone (polars, no model), so a probe kind can declare
its own table beside its items; the probes turn data into items and run
passes; training reads the probes' items (plants, hex rows); the readings
and the papers' verdicts read built tables; the table catalog collects the
views and the kinds' tables; the design reads every declaration to plan
jobs; the entry points run it all.  `python -m canary_audit.architecture`
prints any import against this order.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "canary_audit"

# (layer, the modules in it).  An entry names a module and, for a package,
# every module under it; the longest entry naming a module decides its layer.
# The package itself (`canary_audit`, its version) names only itself.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("records", ("canary_audit", "canary_audit.architecture", "canary_audit.special_tokens", "canary_audit.records",
                 "canary_audit.provenance", "canary_audit.layers", "canary_audit.jobs", "canary_audit.gpus",
                 "canary_audit.imports")),
    ("data", ("canary_audit.data", "canary_audit.formats", "canary_audit.controls")),
    ("model", ("canary_audit.model",)),
    ("views", ("canary_audit.views",)),
    ("probes", ("canary_audit.probes",)),
    ("train", ("canary_audit.train", "canary_audit.export")),
    # views/controls.py reads the papers' readings of built tables
    ("readings", ("canary_audit.readings", "canary_audit.papers", "canary_audit.claims", "canary_audit.headline",
                  "canary_audit.views.controls", "canary_audit.floors")),
    ("tables", ("canary_audit.views.catalog", "canary_audit.tables", "canary_audit.plots", "canary_audit.summary")),
    ("design", ("canary_audit.design", "canary_audit.plan", "canary_audit.preflight")),
    ("entry", ("canary_audit.cli", "canary_audit.__main__", "canary_audit.warm", "canary_audit.status")),
)


class LayerError(ValueError):
    """A module that no layer names."""


def layer_of(module: str, layers=LAYERS, package: str = PACKAGE) -> int:
    """The index of `module`'s layer (0: the bottom)."""
    best: tuple[int, int] | None = None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            named = module == entry or (entry != package and module.startswith(entry + "."))
            if named and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None:
        raise LayerError(f"module `{module}` is in no layer: add it to {package}.architecture.LAYERS")
    return best[1]


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


def upward(graph: dict[str, set[str]], layers=LAYERS, package: str = PACKAGE) -> list[str]:
    """Each import of a module of a higher layer than the importer's."""
    names = [layer for layer, _ in layers]
    out = []
    for module, targets in sorted(graph.items()):
        own = layer_of(module, layers, package)
        for target in sorted(targets):
            theirs = layer_of(target, layers, package)
            if theirs > own:
                out.append(f"`{module}` ({names[own]}) imports `{target}` ({names[theirs]}), a layer above")
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of two or more modules that import each other through
    some chain (the strongly connected components of the import graph)."""
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
    """Every upward import and every import circle of the package under `root`."""
    graph = import_graph(root, package)
    return [*upward(graph, layers, package), *(f"import circle: {' <-> '.join(c)}" for c in circles(graph))]


if __name__ == "__main__":
    found = violations(Path(__file__).resolve().parents[1])
    print("\n".join(found) or "imports run one way down the layers")
    sys.exit(1 if found else 0)

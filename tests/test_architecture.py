"""The house's layers (canary_audit/architecture.py): each layer is one
folder, imports run one way down them, and no module or folder is in an
import circle; the check is shown to fail on a planted upward import (at
the top, lazy, type-only), a planted module in the wrong folder, a planted
two-module circle, a planted loop between folders and a planted module at
the package's top level; and a probe kind is still added in one module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from canary_audit import architecture as arch

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def test_imports_run_one_way_down_the_layers():
    assert arch.violations(SRC) == []


def test_every_module_sits_in_its_layers_folder():
    """Each module's layer is its folder; the layers' folders are the
    package's folders, and only the named modules sit outside them."""
    found = arch.modules(SRC)
    for name in found:
        arch.layer_of(name)  # raises for a module in no layer's folder
    folders = {p.name for p in (SRC / "canary_audit").iterdir() if (p / "__init__.py").is_file()}
    assert folders == {name for name, _ in arch.LAYERS}
    loose = {n for n in found if n.count(".") < 2 and n.removeprefix("canary_audit.") not in folders}
    assert loose == set(arch.OUTSIDE)


@pytest.fixture
def house(tmp_path) -> Path:
    """A copy of the package to plant imports in."""
    shutil.copytree(SRC / "canary_audit", tmp_path / "canary_audit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert arch.violations(tmp_path) == []
    return tmp_path


def _plant(root: Path, module: str, text: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text((path.read_text() if path.exists() else "") + "\n" + textwrap.dedent(text))


@pytest.mark.parametrize("planted", [
    "from canary_audit.publish.catalog import registry\n",                     # at the top
    "def late():\n    from canary_audit.probes import passes  # noqa\n",      # lazy, in a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from canary_audit.design import Design\n",
])
def test_a_planted_upward_import_fails(house, planted):
    _plant(house, "canary_audit.core.records", planted)
    found = arch.violations(house)
    assert found and all("`canary_audit.core.records` (core) imports" in f for f in found
                         if "circle" not in f and "loop" not in f)


def test_a_planted_module_in_the_wrong_folder_fails(house):
    """The claim parser (verdicts/claims.py) dropped into views/: it reads
    the measure registry, a layer above its new folder (and so views/ and
    verdicts/ now import each other)."""
    shutil.copy2(house / "canary_audit" / "verdicts" / "claims.py", house / "canary_audit" / "views" / "claims.py")
    assert arch.violations(house) == [
        "`canary_audit.views.claims` (views) imports `canary_audit.verdicts.measures` (verdicts), a layer above",
        "folder loop: canary_audit.verdicts <-> canary_audit.views"]


def test_a_planted_two_module_circle_fails(house):
    # both modules in the bottom folder: no import runs upward, only round
    _plant(house, "canary_audit.core.jobs", "import canary_audit.core.gpus\n")
    _plant(house, "canary_audit.core.gpus", "from canary_audit.core import jobs\n")
    assert arch.violations(house) == ["import circle: canary_audit.core.gpus <-> canary_audit.core.jobs"]


def test_a_planted_loop_between_folders_fails(house):
    """A probe kind that reads the loops of probes/items.py, which read the
    kinds: no module circle, but probes/ and probes/kinds/ import each other."""
    _plant(house, "canary_audit.probes.kinds.echo",
           "from canary_audit.probes.items import in_unit  # noqa\nKINDS = ()\n")
    assert arch.violations(house) == ["folder loop: canary_audit.probes <-> canary_audit.probes.kinds"]


def test_a_module_outside_the_folders_is_refused(house):
    (house / "canary_audit" / "stray.py").write_text("X = 1\n")
    with pytest.raises(arch.LayerError, match=r"`canary_audit.stray` is in no layer's folder: move it into one of "):
        arch.violations(house)


NEW_KIND = '''
"""A probe kind added in one module, shaped like kextract: a hex decode
builder with a setting of its own, and a table over its records."""

from canary_audit.probes.kinds.hex import hex_rows
from canary_audit.probes.kinds import DecodeItem, ItemInputs, ProbeKind
from canary_audit.core.records import GREEDY
from canary_audit.views.table import Context, Table

NAME = "echo"


def items(inputs: ItemInputs) -> list[DecodeItem]:
    return [DecodeItem(NAME, f"{r.item_id}@{inputs.settings['cut']}", r.item_id, GREEDY,
                       r.prefix[: inputs.settings["cut"]], r.secret)
            for r in hex_rows(inputs.data_dir, inputs.vision, members_only=True)]


def build(ctx: Context):
    return ("echo", ctx.decode.filter(ctx.decode["probe_set"] == NAME)) if ctx.has("decode", NAME) else None


KINDS = (ProbeKind(NAME, "hex", decode=items, settings={"cut": 3}, tables=(Table(NAME, "hex", build),)),)
'''

PROBE = '''
import json, sys
from canary_audit.architecture import violations
from canary_audit.design import Design
from canary_audit.core.config_merge import merge
from canary_audit.probes.kinds import probe_kinds
from canary_audit.publish.catalog import registry
import yaml

root, config = sys.argv[1], sys.argv[2]
design = Design(merge(yaml.safe_load(open(config))))
print(json.dumps({
    "kinds": [k.name for k in probe_kinds()],
    "tables": [t.name for t in registry()],
    "declared": design.table_names(),
    "params": design.probe_slice("decode", "hex").get("kinds", {}),
    "violations": violations(__import__("pathlib").Path(root)),
}))
'''


def test_a_probe_kind_is_still_one_module(house):
    """The three-file extension: a kind module dropped into probes/kinds/
    (its test and its docs line are the other two files) is a registered
    kind whose table the registry and the design declare, whose settings
    reach the job's params with their default, and which imports nothing
    above its layer; no other file of the package is touched."""
    (house / "canary_audit" / "probes" / "kinds" / "echo.py").write_text(NEW_KIND)
    env = {**os.environ, "PYTHONPATH": str(house)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(house), str(ROOT / "workflow_config.yaml")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert "echo" in got["kinds"] and "echo" in got["tables"] and "echo" in got["declared"]
    assert got["params"]["echo"] == {"cut": 3}
    assert got["violations"] == []


def test_docs_name_the_layers_in_their_order():
    """docs/extending.md's layer list is the declaration's, in order."""
    import re

    text = (ROOT / "docs" / "extending.md").read_text()
    section = text.split("## The house's layers", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"\*\*(\w+)/\*\*", section) == [name for name, _ in arch.LAYERS]

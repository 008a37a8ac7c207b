"""Weights made outside the workflow, audited beside the design's variants
(`models.<m>.imports`): a PEFT adapter folder or a full checkpoint folder,
with the variant it was made from (its parent) and what it is.

Everything here reads files only (JSON and safetensors headers, no torch),
so the design can refuse a bad import before any job: a missing folder,
pickled weights, an adapter whose target modules or tensor shapes do not
fit the parent's weights, a checkpoint of another architecture.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

ADAPTER, CHECKPOINT = "adapter", "checkpoint"
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# What an import is: an unlearning checkpoint of a memorization branch, a
# benign fine-tune of a canary-merged base, a fine-tune on a model's own
# secrets (`models.<m>.secrets`), or any other changed model.
ROLES = ("unlearned", "bsft", "tuned", "changed")
# The design's variant kinds each role may have as its parent.
PARENT_KINDS = {"unlearned": ("memorized", "unlearned"), "bsft": ("merged_base",), "tuned": ("base",),
                "changed": None}


class ImportRefused(ValueError):
    """An import that cannot be audited as given (the message names the key)."""


@dataclass(frozen=True)
class Import:
    """One entry of `models.<model>.imports`, resolved: its folder's form
    (adapter or checkpoint) and its settings."""

    model: str
    name: str
    path: Path
    form: str
    parent: str
    role: str
    on: str = "parent"
    k: int | None = None
    label: str | None = None
    application: str = "stacked"

    @property
    def key(self) -> str:
        return f"models.{self.model}.imports.{self.name}"

    @property
    def group(self) -> str:
        """Its probe group: its own, so adding, changing or removing it
        re-runs its passes only."""
        return f"import-{self.name}"


def safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {dtype, shape} from a safetensors file's header."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    header.pop("__metadata__", None)
    return header


def weight_shapes(folder: Path) -> dict[str, list[int]]:
    """Every tensor's shape over a checkpoint folder's safetensors files."""
    shapes = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        shapes.update({k: v["shape"] for k, v in safetensors_header(file).items()})
    return shapes


def resolve(model: str, name: str, entry: dict) -> Import:
    """An import entry, checked as files: the folder exists and holds
    safetensors weights in one of the two forms; its settings fit its form
    and role."""
    key = f"models.{model}.imports.{name}"
    path = Path(entry["path"])
    if not path.is_dir():
        raise ImportRefused(f"config key `{key}.path`: `{path}` is not a folder; give the folder of a PEFT adapter "
                           "(adapter_config.json, adapter_model.safetensors) or of a full checkpoint")
    pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLED)
    if (path / "adapter_config.json").is_file():
        form = ADAPTER
        if not (path / "adapter_model.safetensors").is_file():
            raise ImportRefused(f"config key `{key}.path`: `{path}` holds no adapter_model.safetensors"
                               + (f" (pickled weights {pickled} are refused)" if pickled else "")
                               + "; save the adapter with safe_serialization=True")
    elif list(path.glob("*.safetensors")):
        form = CHECKPOINT
        missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).is_file()]
        if missing:
            raise ImportRefused(f"config key `{key}.path`: the checkpoint `{path}` has no {' or '.join(missing)}; "
                               "save its config and tokenizer beside the weights (save_pretrained of both)")
    else:
        raise ImportRefused(f"config key `{key}.path`: `{path}` holds no safetensors weights"
                           + (f" (pickled weights {pickled} are refused: they can run code when loaded)"
                              if pickled else "")
                           + "; convert it with save_pretrained(..., safe_serialization=True)")
    role = entry["as"]
    given = set(entry)
    if form == CHECKPOINT and "on" in given:
        raise ImportRefused(f"config key `{key}.on`: a full checkpoint replaces the weights; `on` is for adapters")
    if role == "changed" and "label" in given:
        raise ImportRefused(f"config key `{key}.label`: a `changed` import appears under its own name; `label` names "
                            "an unlearning run (as: unlearned) or a bSFT source (as: bsft)")
    if role != "unlearned" and "k" in given:
        raise ImportRefused(f"config key `{key}.k`: only an unlearning checkpoint (`as: unlearned`) has a K")
    if "application" in given and not (role == "bsft" and form == ADAPTER):
        raise ImportRefused(f"config key `{key}.application`: only a bSFT adapter is applied stacked or merged "
                           "(a full checkpoint is merged weights)")
    application = entry.get("application", "merged" if form == CHECKPOINT else "stacked")
    return Import(model, name, path, form, entry["parent"], role, entry.get("on", "parent"), entry.get("k"),
                  entry.get("label"), application)


def check_fits(imp: Import, base: Path) -> None:
    """Refuse an import whose weights do not fit the model's base weights
    (`base`, a checkpoint folder; a LoRA leaves every shape as it is, so
    the parent's weights have the base's shapes): an adapter's target
    modules must exist there with the shapes its lora_A / lora_B matrices
    multiply; a checkpoint must have the base's tensors and shapes."""
    base_shapes = weight_shapes(base)
    if imp.form == CHECKPOINT:
        mine = weight_shapes(imp.path)
        missing = sorted(set(base_shapes) - set(mine))
        wrong = sorted(k for k in set(base_shapes) & set(mine) if base_shapes[k] != mine[k])
        if missing or wrong:
            detail = (f"missing tensors {missing[:3]}" if missing else
                      f"tensor `{wrong[0]}` is {mine[wrong[0]]}, the base's {base_shapes[wrong[0]]}")
            raise ImportRefused(f"config key `{imp.key}.path`: the checkpoint `{imp.path}` is not of model "
                               f"`{imp.model}`'s architecture ({detail}); import it under the model it was made from")
        return
    config = json.loads((imp.path / "adapter_config.json").read_text())
    adapter = safetensors_header(imp.path / "adapter_model.safetensors")
    targets = config.get("target_modules") or []
    for key, info in adapter.items():
        for side in ("lora_A", "lora_B"):
            marker = f".{side}."
            if marker not in key:
                continue
            module = key.split(marker)[0].removeprefix("base_model.model.")
            weight = base_shapes.get(f"{module}.weight")
            if weight is None:
                raise ImportRefused(f"config key `{imp.key}.path`: the adapter targets `{module}`, which model "
                                   f"`{imp.model}`'s weights do not have (its target_modules: {targets}); it was "
                                   "trained on another model")
            out_features, in_features = weight[0], weight[-1]
            fits = info["shape"][-1] == in_features if side == "lora_A" else info["shape"][0] == out_features
            if not fits:
                raise ImportRefused(f"config key `{imp.key}.path`: the adapter's `{key}` has shape {info['shape']}, "
                                   f"which does not multiply `{module}.weight` {weight} of model `{imp.model}`; it "
                                   "was trained on another model")

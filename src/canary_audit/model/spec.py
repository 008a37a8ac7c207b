"""A model-registry entry: everything that differs between the tiny model and a 7B one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """One entry of `models:` in the config.

    `path` is a local directory holding safetensors weights and a tokenizer;
    for the embedded model it is the directory the base-model rule writes.
    """

    name: str
    path: Path
    dtype: str = "float32"
    think_open: str | None = "<think>"  # None: a model without think tags (no trace)
    think_close: str | None = "</think>"
    chat_template: str | None = None
    trust_remote_code: bool = False
    vision: bool = False  # a vision-language checkpoint (Qwen2.5-VL): images are fed to its vision tower
    merge_dtype: str | None = None  # the precision a merge rounds the weights into (None: `dtype`)
    # A recovery variant's quantization attack (model/quantize.py format name):
    # its effective weights, every adapter merged, quantized at load.  Set
    # by the design for a variant, never by a `models:` entry.
    quantize: str | None = None
    # The quantization attack's planted positive (model/quantize.py, `clip_model`):
    # its two adapters are an unlearned checkpoint's parent and the checkpoint;
    # the checkpoint's change from the parent is clipped into the parent's bins
    # under this format, so quantizing the result gives the quantized parent.
    clip: str | None = None

    @property
    def merge_precision(self) -> str:
        """What a merged checkpoint is stored in: a merge adds the LoRA's
        update to the weights and rounds the sum into this dtype (paper B's
        testbed stores bf16 weights, where a small update can round away)."""
        return self.merge_dtype or self.dtype

    @staticmethod
    def think_tags(entry: dict) -> tuple[str | None, str | None]:
        """A model entry's think tags: as given (null: none), else a text
        model's `<think>` / `</think>`, and no tags for a vision-language
        model (paper B's Qwen2.5-VL has none in its vocabulary) or a model
        audited on secrets of its own (no paper A arm reads a trace)."""
        default = (None, None) if entry.get("vision") or entry.get("secrets") else ("<think>", "</think>")
        return (entry["think_open"] if "think_open" in entry else default[0],
                entry["think_close"] if "think_close" in entry else default[1])

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """The entry a job's `--model` gives (Design.model_entry as JSON:
        the config entry with its name and path)."""
        entry = json.loads(text)
        return cls.from_config(entry["name"], entry, entry["path"])

    @classmethod
    def from_config(cls, name: str, entry: dict, path: Path | str) -> ModelSpec:
        think_open, think_close = cls.think_tags(entry)
        return cls(
            name=name,
            path=Path(path),
            dtype=entry.get("dtype", "float32"),
            think_open=think_open,
            think_close=think_close,
            chat_template=entry.get("chat_template"),
            trust_remote_code=bool(entry.get("trust_remote_code", False)),
            vision=bool(entry.get("vision", False)),
            merge_dtype=entry.get("merge_dtype"),
            quantize=entry.get("quantize"),
            clip=entry.get("clip"),
        )

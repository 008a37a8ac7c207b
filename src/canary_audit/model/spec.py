"""A model-registry entry: everything that differs between the tiny model and a 7B one."""

from __future__ import annotations

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

    @classmethod
    def from_config(cls, name: str, entry: dict, path: Path | str) -> ModelSpec:
        return cls(
            name=name,
            path=Path(path),
            dtype=entry.get("dtype", "float32"),
            think_open=entry.get("think_open", "<think>"),
            think_close=entry.get("think_close", "</think>"),
            chat_template=entry.get("chat_template"),
            trust_remote_code=bool(entry.get("trust_remote_code", False)),
            vision=bool(entry.get("vision", False)),
        )

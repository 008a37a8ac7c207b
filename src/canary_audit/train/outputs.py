"""A training job's outputs as its command names them (`--out` forms the
rules write: `ADAPTER MERGED [UNDER_ADAPTER UNDER_MERGED]`, `t<STEP>=DIR ...
[noise=DIR]`, `K=DIR ...`), turned into the calls of train/adapters.py; and
the planted controls' adapters of paper A, which reuse its recipes."""

from __future__ import annotations

from pathlib import Path

from canary_audit.model.spec import ModelSpec
from canary_audit.train.adapters import (
    train_bsft,
    train_canary,
    train_memorization,
    train_reference,
    train_unlearning,
)


def train_control(spec: ModelSpec, data_dir: Path, cfg: dict, out_dir: Path) -> dict:
    """A planted control's adapter (data/planted_controls.py): the
    memorization recipe on its control template, or with `retain_only` on
    that template's retain examples alone."""
    train = train_reference if cfg.get("retain_only") else train_memorization
    return train(spec, data_dir, {k: v for k, v in cfg.items() if k != "retain_only"}, out_dir)


def train_canary_outputs(spec: ModelSpec, data_dir: Path, cfg: dict, outs: list[str]) -> dict:
    """`outs`: ADAPTER [MERGED [UNDER_ADAPTER UNDER_MERGED]]."""
    paths = [Path(o) for o in outs]
    return train_canary(spec, data_dir, cfg, paths[0], merged_dir=paths[1] if len(paths) > 1 else None,
                        under=(paths[2], paths[3]) if len(paths) > 3 else None)


def train_bsft_outputs(spec: ModelSpec, data_dir: Path, cfg: dict, outs: list[str]) -> dict:
    """`outs`: t<STEP>=DIR ... [noise=DIR]."""
    named = dict(o.split("=", 1) for o in outs)
    noise = named.pop("noise", None)
    return train_bsft(spec, data_dir, cfg, {int(k.removeprefix("t")): Path(p) for k, p in named.items()},
                      Path(noise) if noise else None)


def train_unlearning_outputs(spec: ModelSpec, memorized: Path, data_dir: Path, cfg: dict, outs: list[str],
                             state_in: Path | None, state_out: Path | None) -> dict:
    """`outs`: K=DIR ... (one K under the fine grain, with the states)."""
    return train_unlearning(spec, memorized, data_dir, cfg, {int(k): Path(p) for k, p in
                                                            (o.split("=", 1) for o in outs)},
                            state_in=state_in, state_out=state_out)

"""Resumable training: a killed training job continues from its last saved step.

A 7B memorization run can take an hour; losing it to a pre-empted SLURM job
is not acceptable.  Every `every` steps the loop saves what the next step
depends on (trainable weights, AdamW moments, the batch sampler's generator,
the losses so far) beside the job's output, as safetensors and JSON, never
pickle.  The state is keyed by the hash of the run's config slice: a state
left by a run with other settings is discarded, not resumed.  Resumed and
uninterrupted runs give bitwise-identical adapters (tested).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
RESUME_EVERY = 50  # steps between saved training states


@dataclass(frozen=True)
class ResumeState:
    """Where one training run keeps its resumable state, and for which config."""

    path: Path
    key: str
    every: int = RESUME_EVERY

    @classmethod
    def beside(cls, output: Path, key: str) -> ResumeState:
        """The state folder of a run whose (first) output is `output`."""
        output = Path(output)
        return cls(output.with_name(f".{output.name}.resume"), key, RESUME_EVERY)

    def save(self, step: int, model, optimizer, generator, losses: list[float]) -> None:
        from safetensors.torch import save_file

        tensors = {f"param.{n}": p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, p in enumerate(params):
            for name, value in optimizer.state.get(p, {}).items():
                tensors[f"opt.{i}.{name}"] = value.detach().contiguous()
        tensors["generator"] = generator.get_state()
        tmp = self.path.with_name(self.path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(tensors, tmp / "state.safetensors")
        (tmp / "state.json").write_text(json.dumps({"key": self.key, "step": step, "losses": losses}))
        shutil.rmtree(self.path, ignore_errors=True)
        tmp.rename(self.path)

    def load(self, model, optimizer, generator) -> tuple[int, list[float]]:
        """Restore the saved state into the live objects: (step done, losses).
        (0, []) when there is none, or it belongs to another configuration."""
        meta_file = self.path / "state.json"
        if not meta_file.exists():
            return 0, []
        meta = json.loads(meta_file.read_text())
        if meta.get("key") != self.key:
            log.info("discarding training state in %s: it belongs to another configuration", self.path)
            self.clear()
            return 0, []
        from safetensors.torch import load_file

        tensors = load_file(self.path / "state.safetensors")
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.data.copy_(tensors[f"param.{name}"])
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, p in enumerate(params):
            # Moments go to their parameter's device; AdamW keeps its step
            # count on the CPU (unless capturable), so it stays there.
            state = {k.split(".", 2)[2]: v if k.endswith(".step") else v.to(p.device)
                     for k, v in tensors.items() if k.startswith(f"opt.{i}.")}
            if state:
                optimizer.state[p] = state
        generator.set_state(tensors["generator"])
        log.info("resuming training from step %d (%s)", meta["step"], self.path)
        return meta["step"], meta["losses"]

    @property
    def kept(self) -> Path:
        """Copies of the outputs saved during the run (an unlearning run's K
        checkpoints): Snakemake deletes a failed job's outputs, and a resumed
        run does not pass those steps again."""
        return self.path.with_name(self.path.name + ".kept")

    def keep(self, name: str, src: Path) -> None:
        tmp = self.kept / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        shutil.rmtree(self.kept / name, ignore_errors=True)
        tmp.rename(self.kept / name)

    def restore(self, name: str, dst: Path) -> bool:
        """Put back a kept output the run did not write again; True if it did."""
        src, dst = self.kept / name, Path(dst)
        if dst.exists() or not src.is_dir():
            return False
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        tmp.rename(dst)
        log.info("restored %s from the interrupted run's copy", dst)
        return True

    def clear(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.kept, ignore_errors=True)

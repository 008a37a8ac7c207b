"""The unlearning methods, declared once: name -> its hyperparameters (with
defaults and bounds) and the function that builds its step loss.

Everything else reads this registry: the config schema's method names and
per-run keys (a test fails when they disagree), the design's per-run
validation (a setting the method does not use is refused for it), the
unlearning job, and the tables' settings column.  Adding a method is one
loss builder plus one `UnlearnMethod` entry (docs/extending.md).

A step loss is `loss(model, forget_idx, retain_seqs)`: the forget batch by
index into the encoded forget set (NPO's reference log-probs are indexed the
same way) and the retain batch as sequences.  Losses are built after the
memorized adapter is loaded, so a method can take a frozen reference from
it before the first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the loop module imports torch-side helpers; the registry must not
    from canary_audit.train.lora import StepLoss


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its default and the open/closed lower bound it must
    exceed (`above`) or reach (`at_least`)."""

    default: float
    doc: str
    above: float | None = None
    at_least: float | None = None
    integer: bool = False

    def check(self, method: str, name: str, value) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and self.integer:
            ok = float(value).is_integer()
        if ok and self.above is not None:
            ok = value > self.above
        if ok and self.at_least is not None:
            ok = value >= self.at_least
        if not ok:
            bound = (f"> {self.above}" if self.above is not None else f">= {self.at_least}"
                     if self.at_least is not None else "a number")
            kind = "an integer " if self.integer else "a number "
            raise ValueError(f"`{name}` = {value!r} of method `{method}`: must be {kind}{bound} ({self.doc})")


@dataclass(frozen=True)
class UnlearnMethod:
    name: str
    summary: str
    params: dict[str, Param] = field(default_factory=dict)
    build: Callable[..., StepLoss] | None = None

    def settings(self, given: dict) -> dict:
        """The method's effective hyperparameters: `given` over the defaults,
        each checked; a key the method does not take is refused."""
        unused = sorted(set(given) - set(self.params))
        if unused:
            takes = ", ".join(self.params) or "no hyperparameters"
            raise ValueError(f"method `{self.name}` does not use {', '.join(f'`{k}`' for k in unused)} "
                             f"(it takes: {takes})")
        out = {k: given.get(k, p.default) for k, p in self.params.items()}
        for k, value in out.items():
            self.params[k].check(self.name, k, value)
        return out


def _nll(model, seqs, pad_id):
    from canary_audit.train.lora import sequence_logprobs

    logp, n = sequence_logprobs(model, seqs, pad_id)
    return -logp.sum() / n.sum()


def _with_retain(forget_loss: StepLoss, weight: float, pad_id: int) -> StepLoss:
    """`forget_loss` plus `weight` x the retain batch's token-mean NLL."""
    def loss(model, idx, retain):
        total = forget_loss(model, idx, retain)
        if weight and retain:
            total = total + weight * _nll(model, retain, pad_id)
        return total
    return loss


def _reference_logprobs(model, forget, pad_id):
    """Summed log-prob of every forget sequence under the model as loaded
    (the memorized adapter), before any step: NPO's frozen reference."""
    import torch

    from canary_audit.train.lora import sequence_logprobs

    with torch.no_grad():
        model.eval()
        ref = torch.cat([sequence_logprobs(model, forget[i:i + 32], pad_id)[0] for i in range(0, len(forget), 32)])
    model.train()
    return ref


def build_ga(model, forget, pad_id, settings) -> StepLoss:
    """Gradient ascent: minimise the token-mean log-likelihood of the forget batch."""
    from canary_audit.train.lora import sequence_logprobs

    def loss(m, idx, retain):
        logp, n = sequence_logprobs(m, [forget[i] for i in idx], pad_id)
        return logp.sum() / n.sum()
    return loss


def build_graddiff(model, forget, pad_id, settings) -> StepLoss:
    """Gradient difference: gradient ascent on the forget batch plus the
    retain NLL at `retain_weight` (Liu et al. 2022; open-unlearning GradDiff)."""
    return _with_retain(build_ga(model, forget, pad_id, settings), settings["retain_weight"], pad_id)


def build_npo(model, forget, pad_id, settings) -> StepLoss:
    """NPO (Zhang et al. 2024): -(2/beta) E log sigmoid(-beta (log p - log p_ref)),
    the reference being the memorized model; with `retain_weight` > 0, plus
    the retain NLL (NPO+RT)."""
    import torch.nn.functional as F

    from canary_audit.train.lora import sequence_logprobs

    ref, beta = _reference_logprobs(model, forget, pad_id), settings["beta"]

    def forget_loss(m, idx, retain):
        logp, _ = sequence_logprobs(m, [forget[i] for i in idx], pad_id)
        return -(2.0 / beta) * F.logsigmoid(-beta * (logp - ref[idx])).mean()
    return _with_retain(forget_loss, settings["retain_weight"], pad_id)


def build_simnpo(model, forget, pad_id, settings) -> StepLoss:
    """SimNPO (Fan et al. 2024, open-unlearning SimNPO): reference-free NPO on
    the length-normalised log-likelihood with a margin gamma,
    -(2/beta) E log sigmoid(-(beta/|y|) log p(y|x) - gamma), plus the retain
    NLL at `retain_weight`."""
    import torch.nn.functional as F

    from canary_audit.train.lora import sequence_logprobs

    beta, gamma = settings["beta"], settings["gamma"]

    def forget_loss(m, idx, retain):
        logp, n = sequence_logprobs(m, [forget[i] for i in idx], pad_id)
        return -(2.0 / beta) * F.logsigmoid(-beta * logp / n - gamma).mean()
    return _with_retain(forget_loss, settings["retain_weight"], pad_id)


METHODS: dict[str, UnlearnMethod] = {m.name: m for m in (
    UnlearnMethod("npo", "negative preference optimisation against the memorized model", {
        "beta": Param(0.1, "inverse temperature of the NPO loss", above=0),
        "retain_weight": Param(0.0, "weight of the retain NLL added to the loss (NPO+RT when > 0)", at_least=0),
    }, build_npo),
    UnlearnMethod("ga", "gradient ascent on the forget set, no retain term", {}, build_ga),
    UnlearnMethod("graddiff", "gradient ascent on the forget set plus the retain NLL", {
        "retain_weight": Param(1.0, "weight of the retain NLL", above=0),
    }, build_graddiff),
    UnlearnMethod("simnpo", "reference-free, length-normalised NPO with a margin", {
        "beta": Param(2.5, "inverse temperature", above=0),
        "gamma": Param(0.0, "margin", at_least=0),
        "retain_weight": Param(1.0, "weight of the retain NLL", at_least=0),
    }, build_simnpo),
)}
# Shared training settings an unlearning run may set for itself, falling back
# to the `unlearn` block's value.  The K sweep is shared: it names the jobs'
# outputs, which must not depend on the run.  (Gradient checkpointing is not
# among them: it changes memory and time, not the loss.)
SHARED_SETTINGS = ("lr", "loss_span", "batch_forget", "batch_retain")


def step_loss(method: str, model, forget, pad_id: int, settings: dict) -> StepLoss:
    """The step loss of `method` with its effective `settings`."""
    if method not in METHODS:
        raise ValueError(f"unlearning method `{method}`: must be one of {', '.join(METHODS)}")
    entry = METHODS[method]
    return entry.build(model, forget, pad_id, {k: settings[k] for k in entry.params})

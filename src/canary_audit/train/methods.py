"""The unlearning methods, declared once: name -> its hyperparameters (with
defaults and bounds) and the function that builds its step loss.

Everything else reads this registry: the config schema's method names and
per-run keys (a test fails when they disagree), the design's per-run
validation (a setting the method does not use is refused for it), the
unlearning job, and the tables' settings column.  Adding a method is one
loss builder plus one `UnlearnMethod` entry (docs/extending.md).

A step loss is `loss(model, forget_idx, retain_idx)`: both batches as
indices into the encoded forget and retain sets, so a method can index
references it computed for every sequence before the first step (NPO's
log-probs, RMU's retain activations).  Losses are built after the memorized
adapter is loaded: that frozen model is every reference.
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
            raise ValueError(f"`{name}` = {value!r} of method `{method}`: must be {kind}{bound} ({self.doc}); "
                             "set it in range, or leave it out for the default")


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
                             f"(it takes: {takes}); remove it, or choose a method that uses it")
        out = {k: given.get(k, p.default) for k, p in self.params.items()}
        for k, value in out.items():
            self.params[k].check(self.name, k, value)
        return out


def _nll(model, seqs, pad_id):
    from canary_audit.train.lora import sequence_logprobs

    logp, n = sequence_logprobs(model, seqs, pad_id)
    return -logp.sum() / n.sum()


def _with_retain(forget_loss: StepLoss, retain, weight: float, pad_id: int) -> StepLoss:
    """`forget_loss` plus `weight` x the retain batch's token-mean NLL."""
    def loss(model, idx, r_idx):
        total = forget_loss(model, idx, r_idx)
        if weight and r_idx:
            total = total + weight * _nll(model, [retain[i] for i in r_idx], pad_id)
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


def build_ga(model, forget, retain, pad_id, settings) -> StepLoss:
    """Gradient ascent: minimise the token-mean log-likelihood of the forget batch."""
    from canary_audit.train.lora import sequence_logprobs

    def loss(m, idx, r_idx):
        logp, n = sequence_logprobs(m, [forget[i] for i in idx], pad_id)
        return logp.sum() / n.sum()
    return loss


def build_graddiff(model, forget, retain, pad_id, settings) -> StepLoss:
    """Gradient difference: gradient ascent on the forget batch plus the
    retain NLL at `retain_weight` (Liu et al. 2022; open-unlearning GradDiff)."""
    return _with_retain(build_ga(model, forget, retain, pad_id, settings), retain, settings["retain_weight"], pad_id)


def build_npo(model, forget, retain, pad_id, settings) -> StepLoss:
    """NPO (Zhang et al. 2024): -(2/beta) E log sigmoid(-beta (log p - log p_ref)),
    the reference being the memorized model; with `retain_weight` > 0, plus
    the retain NLL (NPO+RT)."""
    import torch.nn.functional as F

    from canary_audit.train.lora import sequence_logprobs

    ref, beta = _reference_logprobs(model, forget, pad_id), settings["beta"]

    def forget_loss(m, idx, r_idx):
        logp, _ = sequence_logprobs(m, [forget[i] for i in idx], pad_id)
        return -(2.0 / beta) * F.logsigmoid(-beta * (logp - ref[idx])).mean()
    return _with_retain(forget_loss, retain, settings["retain_weight"], pad_id)


def build_simnpo(model, forget, retain, pad_id, settings) -> StepLoss:
    """SimNPO (Fan et al. 2024, open-unlearning SimNPO): reference-free NPO on
    the length-normalised log-likelihood with a margin gamma,
    -(2/beta) E log sigmoid(-(beta/|y|) log p(y|x) - gamma), plus the retain
    NLL at `retain_weight`."""
    import torch.nn.functional as F

    from canary_audit.train.lora import sequence_logprobs

    beta, gamma = settings["beta"], settings["gamma"]

    def forget_loss(m, idx, r_idx):
        logp, n = sequence_logprobs(m, [forget[i] for i in idx], pad_id)
        return -(2.0 / beta) * F.logsigmoid(-beta * logp / n - gamma).mean()
    return _with_retain(forget_loss, retain, settings["retain_weight"], pad_id)


def _hidden_at(model, seqs, pad_id, layer: int):
    """Hidden states after decoder layer `layer` (1 = the first) at each
    sequence's labelled positions, concatenated: [tokens, hidden]."""
    from canary_audit.model.embedded import pad_batch

    batch = pad_batch([s.ids for s in seqs], pad_id, side="right", labels=[s.labels for s in seqs],
                      device=model.device)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    return out.hidden_states[layer][batch["labels"] != -100].float()


def build_rmu(model, forget, retain, pad_id, settings) -> StepLoss:
    """RMU, representation misdirection (Li et al. 2024, WMDP; open-unlearning
    RMU), on the LoRA-wrapped model: the forget batch's hidden states after
    decoder layer `layer` are pushed (mean squared error) towards a fixed
    random direction scaled to `steering_coeff`, and the retain batch's are
    held at the memorized model's (frozen, computed once before step 1) at
    weight `retain_weight` (WMDP's alpha).  Positions are the loss span's, as for every method.
    The direction is seeded by `direction_seed`, so a run is reproducible."""
    import torch
    import torch.nn.functional as F

    layer, n_layers = int(settings["layer"]), model.config.num_hidden_layers
    if layer > n_layers:
        raise ValueError(f"`layer` = {layer} of method `rmu`: the model has {n_layers} decoder layers; "
                         f"choose 1..{n_layers}")
    gen = torch.Generator().manual_seed(int(settings["direction_seed"]))
    direction = torch.rand(model.config.hidden_size, generator=gen)
    control = (settings["steering_coeff"] * direction / direction.norm()).to(model.device)
    with torch.no_grad():
        model.eval()
        frozen = [_hidden_at(model, [seq], pad_id, layer) for seq in retain]
    model.train()

    def loss(m, idx, r_idx):
        total = F.mse_loss(*torch.broadcast_tensors(_hidden_at(m, [forget[i] for i in idx], pad_id, layer), control))
        if r_idx:
            held = _hidden_at(m, [retain[i] for i in r_idx], pad_id, layer)
            total = total + settings["retain_weight"] * F.mse_loss(held, torch.cat([frozen[i] for i in r_idx]))
        return total
    return loss


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
    UnlearnMethod("rmu", "representation misdirection: forget activations to a random direction", {
        "layer": Param(1, "decoder layer whose output is steered (1 = the first)", at_least=1, integer=True),
        "steering_coeff": Param(20.0, "norm of the random control vector", above=0),
        "retain_weight": Param(100.0, "weight of the retain activation-matching term (WMDP's alpha)", at_least=0),
        "direction_seed": Param(0, "seed of the random direction", at_least=0, integer=True),
    }, build_rmu),
)}
# Shared training settings an unlearning run may set for itself, falling back
# to the `unlearn` block's value.  The K sweep is shared: it names the jobs'
# outputs, which must not depend on the run.  (Gradient checkpointing is not
# among them: it changes memory and time, not the loss.)
SHARED_SETTINGS = ("lr", "loss_span", "batch_forget", "batch_retain")


def step_loss(method: str, model, forget, retain, pad_id: int, settings: dict) -> StepLoss:
    """The step loss of `method` with its effective `settings`."""
    if method not in METHODS:
        raise ValueError(f"unlearning method `{method}`: must be one of {', '.join(METHODS)}")
    entry = METHODS[method]
    return entry.build(model, forget, retain, pad_id, {k: settings[k] for k in entry.params})

"""Weight quantization as an attack on unlearning: quantize-dequantize in
plain torch, at load time, on the effective weights (the base with every
adapter merged).

Zhang et al. (ICLR 2025, "Catastrophic failure of LLM unlearning via
quantization") found that 4-bit quantization brings back much of what
gradient-ascent and NPO unlearning removed: the unlearning moves each weight
by less than a quantization step, and rounding sends it back to the bin of
the weight it came from.  The attack here is exact to its definition and
stores nothing: a 7B import would otherwise write a checkpoint per variant.

Formats (`parse`), each over blocks of consecutive elements of the
row-major weight (a block is an output channel with `-row`, else `-g<N>`
elements; a weight whose size no block divides gets a short last block):

- `int8`, `int4`: round to nearest on a symmetric grid, the block's absmax
  mapped to the largest level (2^(b-1) - 1), zero exact;
- `...-asym`: the block's min and max mapped to levels 0 and 2^b - 1, with
  a rounded zero point (GPTQ's and AWQ's grid, without their calibration);
- `nf4`: QLoRA's NormalFloat codebook (Dettmers et al. 2023), 16 levels at
  normal quantiles scaled to the block's absmax, block 64 by default
  (bitsandbytes' default; its double quantization of the scales is left out).

Which tensors: every `nn.Linear` weight, but the output head and anything
sharing storage with the input embedding (the tied embedding: bitsandbytes
skips `lm_head` too); embeddings, norms and biases stay as they are.

`bins` gives each element's rounding bin, which the planted positive of the
attack is built from: a delta clipped into its elements' bins (the block's
scale elements held) is invisible to the quantizer, Q(W + D) == Q(W).
torch is imported where it is used: the design parses formats (`parse`)
while the workflow plans, where importing torch would cost seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

RECOVERY = "recovery"  # the kind of a variant a recovery attack made (design/variants.py), read by the views
RECOVERY_PLANT = "recovery_plant"  # the kind of an attack's planted positive (the clipped plant, and it attacked)
NF4_BLOCK = 64
_PATTERN = re.compile(r"^(?P<kind>int8|int4|nf4)(?:-(?P<block>row|g\d+))?(?P<asym>-asym)?$")


class QuantizeError(ValueError):
    """A format the quantizer does not know, or one it cannot apply."""


@dataclass(frozen=True)
class QuantFormat:
    """One quantization format: `kind` (int8, int4, nf4), `block` (None: an
    output channel; else that many consecutive elements) and, for the
    integer grids, whether the grid is asymmetric (min/max and a zero point)."""

    kind: str
    block: int | None
    asym: bool = False

    @property
    def bits(self) -> int:
        return 4 if self.kind in ("int4", "nf4") else 8

    @property
    def name(self) -> str:
        block = "row" if self.block is None else f"g{self.block}"
        return f"{self.kind}-{block}{'-asym' if self.asym else ''}"


def parse(text: str) -> QuantFormat:
    """A format from its name (`int4-g32`, `int8-row`, `int4-g32-asym`,
    `nf4`, `nf4-g64`), or an error listing the grammar."""
    found = _PATTERN.match(str(text))
    if not found:
        raise QuantizeError(f"quantization format `{text}` is not one of {{int8,int4,nf4}}[-row|-g<N>][-asym] "
                            "(e.g. int4-row, int4-g32, int8-row, nf4)")
    kind, block, asym = found["kind"], found["block"], bool(found["asym"])
    if kind == "nf4" and asym:
        raise QuantizeError(f"quantization format `{text}`: NF4's codebook is symmetric about its absmax; drop -asym")
    size = None if block == "row" else int(block[1:]) if block else NF4_BLOCK if kind == "nf4" else None
    if size is not None and size < 2:
        raise QuantizeError(f"quantization format `{text}`: a block holds at least 2 elements")
    return QuantFormat(kind, size, asym)


def nf4_codebook() -> torch.Tensor:
    """NF4's 16 levels from their definition: the normal quantiles of 8
    equally spaced probabilities from 0.9677083 to 0.5 (positive side, 0.5
    left out) and 7 (negative side), zero, normalized to [-1, 1]."""
    import torch

    offset = 0.9677083
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1])
    levels = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).sort().values
    return levels / levels.max()


def _blocks(weight: torch.Tensor, fmt: QuantFormat) -> tuple[torch.Tensor, int]:
    """The weight as rows of one block each (a short last block padded with
    copies of its own last element, which changes no block statistic), and
    the padding added."""
    import torch

    if fmt.block is None:
        return weight.reshape(weight.shape[0], -1), 0
    flat = weight.reshape(-1)
    pad = -flat.numel() % fmt.block
    if pad:
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    return flat.reshape(-1, fmt.block), pad


def _unblock(blocks: torch.Tensor, pad: int, like: torch.Tensor) -> torch.Tensor:
    flat = blocks.reshape(-1)
    return (flat[: flat.numel() - pad] if pad else flat).reshape(like.shape)


def _grid(blocks: torch.Tensor, fmt: QuantFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per element: its level index, its dequantized value, and its bin's
    (lo, hi) ends in weight units, stacked as the last dimension."""
    import torch

    if fmt.kind == "nf4":
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
        code = nf4_codebook().to(device=blocks.device, dtype=blocks.dtype)
        index = (blocks / scale).unsqueeze(-1).sub(code).abs().argmin(dim=-1)
        mids = (code[1:] + code[:-1]) / 2
        lo_edge = torch.cat([code[:1], mids])[index]
        hi_edge = torch.cat([mids, code[-1:]])[index]
        value = code[index] * scale
        return index, value, torch.stack([lo_edge * scale, hi_edge * scale], dim=-1)
    levels = 2**fmt.bits
    if fmt.asym:
        low, high = blocks.amin(dim=1, keepdim=True), blocks.amax(dim=1, keepdim=True)
        step = (high - low) / (levels - 1)
        step = torch.where(step > 0, step, torch.ones_like(step))
        zero = torch.round(-low / step)
        index = torch.clamp(torch.round(blocks / step) + zero, 0, levels - 1)
        value = (index - zero) * step
        return index, value, torch.stack([value - step / 2, value + step / 2], dim=-1).clamp(min=low.unsqueeze(-1),
                                                                                             max=high.unsqueeze(-1))
    top = levels // 2 - 1
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    step = torch.where(absmax > 0, absmax / top, torch.ones_like(absmax))
    index = torch.clamp(torch.round(blocks / step), -top, top)
    value = index * step
    return index, value, torch.stack([value - step / 2, value + step / 2], dim=-1).clamp(
        min=-absmax.unsqueeze(-1), max=absmax.unsqueeze(-1))


def quantize(weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """`weight` quantized to `fmt` and dequantized, in its own dtype (the
    grid is computed in float32, or float64 for a float64 weight)."""
    import torch

    work = weight.detach().to(torch.float64 if weight.dtype == torch.float64 else torch.float32)
    blocks, pad = _blocks(work, fmt)
    _, value, _ = _grid(blocks, fmt)
    return _unblock(value, pad, work).to(weight.dtype)


def bins(weight: torch.Tensor, fmt: QuantFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each element's rounding bin under `fmt`: (lo, hi) in weight units, and
    a mask of the elements that set their block's scale (the absmax, or the
    min and the max), which a delta that must leave the grid in place cannot
    move."""
    import torch

    work = weight.detach().to(torch.float64 if weight.dtype == torch.float64 else torch.float32)
    blocks, pad = _blocks(work, fmt)
    _, _, edges = _grid(blocks, fmt)
    if fmt.asym:
        pinned = (blocks == blocks.amin(dim=1, keepdim=True)) | (blocks == blocks.amax(dim=1, keepdim=True))
    else:
        pinned = blocks.abs() == blocks.abs().amax(dim=1, keepdim=True)
    return (_unblock(edges[..., 0], pad, work), _unblock(edges[..., 1], pad, work),
            _unblock(pinned, pad, work))


def clip_into_bins(weight: torch.Tensor, delta: torch.Tensor, fmt: QuantFormat, eps: float = 0.05) -> torch.Tensor:
    """`delta` with every element of `weight + delta` held inside its own
    rounding bin shrunk by `eps` of the bin's width on each side, and the
    scale-setting elements and the ones `delta` leaves alone not moved:
    Q(weight + result) == Q(weight)."""
    import torch

    lo, hi, pinned = bins(weight, fmt)
    shrink = (hi - lo) * eps
    target = (weight.to(lo.dtype) + delta.to(lo.dtype)).clamp(min=lo + shrink, max=hi - shrink)
    still = pinned | (delta == 0)  # an element the change left alone stays, wherever in its bin it lies
    moved = torch.where(still, torch.zeros_like(target), target - weight.to(lo.dtype))
    return moved.to(delta.dtype)


def quantized_weights(model) -> tuple[list[str], list[str]]:
    """The names of the `nn.Linear` weights the attack quantizes, and of the
    ones it leaves out (the output head, and a weight tied to the input
    embedding)."""
    import torch

    embedding = model.get_input_embeddings()
    tied = {embedding.weight.data_ptr()} if embedding is not None else set()
    head = model.get_output_embeddings()
    kept, left = [], []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if module is head or module.weight.data_ptr() in tied:
            left.append(f"{name}.weight")
        else:
            kept.append(f"{name}.weight")
    return kept, left


def quantize_model(model, fmt: QuantFormat) -> list[str]:
    """Quantize-dequantize `model`'s weights in place (`quantized_weights`);
    the names quantized, in module order."""
    import torch

    kept, _ = quantized_weights(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in kept:
            params[name].copy_(quantize(params[name], fmt))
    return kept


def clip_model(model, parent, fmt: QuantFormat, eps: float = 0.05) -> dict[str, float]:
    """The quantization attack's planted positive, in place: each weight the
    attack quantizes becomes its `parent` weight plus the change `model`
    made to it, clipped into the parent's bins under `fmt` (`clip_into_bins`),
    so that quantizing the result gives the quantized parent bit for bit:
    recovery by construction.  The other weights must be the parent's (a
    LoRA changes only the linears it targets).  Returns, over the quantized
    weights, the share of changed elements the clip moved (the unlearning's
    change that lay outside its bins) and the share of the change's squared
    norm it kept."""
    import torch

    kept, _ = quantized_weights(model)
    mine, theirs = dict(model.named_parameters()), dict(parent.named_parameters())
    changed = moved = 0
    before = after = 0.0
    with torch.no_grad():
        for name, weight in mine.items():
            if name not in kept:
                if not torch.equal(weight, theirs[name]):
                    raise QuantizeError(f"`{name}` differs from the parent's but the attack leaves it out: a clipped "
                                        "plant needs every changed weight quantized")
                continue
            delta = weight - theirs[name]
            clipped = clip_into_bins(theirs[name], delta, fmt, eps)
            changed += int((delta != 0).sum())
            moved += int((clipped != delta).sum())
            before += float(delta.double().pow(2).sum())
            after += float(clipped.double().pow(2).sum())
            weight.copy_(theirs[name] + clipped)
    return {"moved_share": moved / changed if changed else 0.0, "kept_norm_share": after / before if before else 1.0}

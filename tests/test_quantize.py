"""The quantization attack's quantizer (model/quantize.py): each format
against its definition, and the bins a planted positive is clipped into."""

from __future__ import annotations

import pytest
import torch

from canary_audit.model.quantize import (
    QuantizeError,
    bins,
    clip_into_bins,
    nf4_codebook,
    parse,
    quantize,
    quantize_model,
    quantized_weights,
)

FORMATS = ["int8-row", "int4-row", "int4-g32", "int4-g16", "int4-g32-asym", "int8-g64-asym", "nf4", "nf4-g16",
           "int4-g48"]  # g48: blocks that straddle rows of 64, a short last block


def _weight(seed: int = 0, shape=(24, 64)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_the_nf4_codebook_is_qloras_table():
    """QLoRA's appendix lists NF4's levels; the definition reproduces them."""
    published = [-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
                 0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0]
    assert nf4_codebook().tolist() == pytest.approx(published, abs=1e-6)


@pytest.mark.parametrize("bad", ["int3", "fp8", "int4-g1", "nf4-asym", "int4-g", "INT4", "int4-col"])
def test_a_bad_format_is_refused_naming_it_and_the_grammar(bad):
    with pytest.raises(QuantizeError, match=f"`{bad}`"):
        parse(bad)


def test_format_names_round_trip_and_nf4_defaults_to_block_64():
    assert parse("nf4").block == 64 and parse("nf4").name == "nf4-g64"
    assert parse("int4").block is None and parse("int4").name == "int4-row"
    for name in FORMATS:
        assert parse(parse(name).name) == parse(name)


@pytest.mark.parametrize("name", FORMATS)
def test_each_block_holds_at_most_its_levels_and_the_error_is_at_most_half_a_bin(name):
    fmt, w = parse(name), _weight()
    q = quantize(w, fmt)
    lo, hi, _ = bins(w, fmt)
    assert torch.all((w >= lo - 1e-7) & (w <= hi + 1e-7))  # each element lies in its own bin
    if not fmt.asym:  # an asymmetric grid's bins end at the block's min and max, its levels need not
        assert torch.all((q >= lo - 1e-7) & (q <= hi + 1e-7))  # each rounds to a level inside its bin
    block = fmt.block or w.shape[1]
    flat = q.reshape(-1)
    for start in range(0, flat.numel(), block):
        assert flat[start:start + block].unique().numel() <= 2**fmt.bits
    if fmt.kind != "nf4":  # a uniform grid: at most half a step from the weight
        step = (hi - lo).amax()
        assert (w - q).abs().max() <= step / 2 + 1e-7


@pytest.mark.parametrize("name", FORMATS)
def test_quantizing_twice_changes_nothing(name):
    fmt, w = parse(name), _weight(1)
    once = quantize(w, fmt)
    assert torch.allclose(quantize(once, fmt), once, rtol=0, atol=1e-7)


def test_the_symmetric_grid_keeps_zero_and_the_absmax():
    w = _weight(2)
    q = quantize(w, parse("int4-row"))
    assert torch.allclose(q.abs().amax(dim=1), w.abs().amax(dim=1), rtol=1e-6, atol=0)
    assert torch.all(q[w.abs() < w.abs().amax(dim=1, keepdim=True) / 14] == 0)  # under half a step: zero


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_delta_clipped_into_its_bins_is_invisible_bit_for_bit(name, seed):
    """The quantization positive's construction: Q(W + D) == Q(W) exactly
    once D is clipped into W's bins, though D moved most elements and the
    unclipped D moves the quantized weights."""
    fmt, w = parse(name), _weight(seed)
    delta = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed + 10)) * 0.01
    clipped = clip_into_bins(w, delta, fmt)
    assert torch.equal(quantize(w + clipped, fmt), quantize(w, fmt))
    assert (clipped != 0).float().mean() > 0.5
    assert not torch.equal(quantize(w + delta, fmt), quantize(w, fmt))


def test_the_attack_leaves_the_head_and_the_tied_embedding_out(tiny_assets):
    from canary_audit.model.loading import load_model
    from canary_audit.model.spec import ModelSpec

    model = load_model(ModelSpec("tiny", tiny_assets[1]))
    kept, left = quantized_weights(model)
    assert "lm_head.weight" in left and all("lm_head" not in k for k in kept)
    assert any(k.endswith("q_proj.weight") for k in kept) and any(k.endswith("down_proj.weight") for k in kept)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert quantize_model(model, parse("int4-row")) == kept
    after = dict(model.named_parameters())
    for name, value in before.items():
        changed = not torch.equal(after[name], value)
        assert changed == (name in kept), name


def test_a_quantized_variant_is_its_merged_weights_quantized_and_fingerprints_apart(tiny_assets, tmp_path):
    """A spec with `quantize` loads its effective weights (the adapter merged)
    quantized, through VariantModels too, and its fingerprint names the
    format: records of the attack never pass for the unquantized variant's."""
    import dataclasses

    from peft import LoraConfig, get_peft_model

    from canary_audit.model.loading import VariantModels, fingerprint, load_model
    from canary_audit.model.spec import ModelSpec

    spec = ModelSpec("tiny", tiny_assets[1])
    torch.manual_seed(0)
    lora = get_peft_model(load_model(spec), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                       init_lora_weights=False))
    lora.save_pretrained(tmp_path / "a")
    adapters, fmt = [tmp_path / "a"], parse("int4-g16")
    quantized = dataclasses.replace(spec, quantize=fmt.name)
    want = load_model(spec, adapters, merge_all=True)
    quantize_model(want, fmt)
    got = load_model(quantized, adapters)
    with VariantModels().model(quantized, adapters) as through_job:
        for name, value in want.state_dict().items():
            assert torch.equal(got.state_dict()[name], value), name
            assert torch.equal(through_job.state_dict()[name], value), name
    # In a model whose merges round into bf16, the attack still merges its adapter exactly: the attacked
    # model and its twin (the adapter live, unrounded) differ by the quantizer alone.
    bf16 = load_model(dataclasses.replace(quantized, merge_dtype="bfloat16"), adapters).state_dict()
    for name, value in want.state_dict().items():
        assert torch.equal(bf16[name], value), name
    prints = {fingerprint(s, adapters) for s in (spec, quantized, dataclasses.replace(spec, quantize="nf4"))}
    assert len(prints) == 3
    with pytest.raises(Exception, match="scored, never trained"):
        load_model(quantized, adapters, trainable_last=True)


def test_a_clipped_plant_forgets_what_its_change_keeps_and_quantizes_to_its_parent(tiny_assets, tmp_path):
    """The quantization positive (spec.clip): the second adapter's change
    from the first, clipped into the first's bins, quantizes to the
    quantized parent bit for bit, and unquantized it still differs from the
    parent (the clip keeps part of the change)."""
    import dataclasses

    from peft import LoraConfig, get_peft_model

    from canary_audit.model.loading import ModelLoadError, fingerprint, load_model
    from canary_audit.model.spec import ModelSpec

    spec = ModelSpec("tiny", tiny_assets[1])
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        lora = get_peft_model(load_model(spec), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
        lora.save_pretrained(tmp_path / f"a{seed}")
        paths.append(tmp_path / f"a{seed}")
    fmt = "int4-g16"
    parent = load_model(dataclasses.replace(spec, quantize=fmt), paths[:1])
    plant = load_model(dataclasses.replace(spec, clip=fmt), paths)
    attacked = load_model(dataclasses.replace(spec, clip=fmt, quantize=fmt), paths)
    plain_parent = load_model(spec, paths[:1], merge_all=True)
    for name, value in parent.state_dict().items():
        assert torch.equal(attacked.state_dict()[name], value), name
    changed = [n for n, v in plant.state_dict().items() if not torch.equal(v, plain_parent.state_dict()[n])]
    assert changed and all("q_proj" in n or "v_proj" in n for n in changed)
    prints = {fingerprint(dataclasses.replace(spec, clip=c, quantize=q), paths)
              for c, q in ((None, None), (fmt, None), (fmt, fmt))}
    assert len(prints) == 3
    with pytest.raises(ModelLoadError, match="reads two adapters"):
        load_model(dataclasses.replace(spec, clip=fmt), paths[:1])

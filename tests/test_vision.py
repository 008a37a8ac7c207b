"""The vision-language path on a tiny Qwen2.5-VL built locally from the tiny
text model: the build, the image data, the passes against plain forwards and
`generate`, the LoRA's reach, and refused input."""

from __future__ import annotations

import dataclasses
import json
import shutil

import polars as pl
import pytest
from conftest import assert_token_records_close

from canary_audit.design.slices import resolved_settings


def _vl(tiny_vl_assets):
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_model, load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.model.vision import VisionInputs

    spec = ModelSpec("tiny_vl", tiny_vl_assets[1], vision=True, think_open=None, think_close=None)
    tok = load_tokenizer(spec)
    return spec, tok, ChatFormat(tok, None, None), VisionInputs.load(spec.path, tok), load_model(spec)


def test_the_language_tower_is_the_text_model(tiny_assets, tiny_vl_assets):
    """On text alone the built VL model gives the text model's logits over the
    text vocabulary (the copied weights, zero q/k/v biases, and mrope with
    equal position axes are the text model's rotary embedding)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    text = AutoModelForCausalLM.from_pretrained(tiny_assets[1]).eval()
    vl = AutoModelForImageTextToText.from_pretrained(tiny_vl_assets[1]).eval()
    ids = AutoTokenizer.from_pretrained(tiny_assets[1])("Record 07 access code: TEXTCAN-0a1b-END",
                                                        return_tensors="pt").input_ids
    with torch.no_grad():
        want = text(input_ids=ids).logits
        got = vl(input_ids=ids).logits[..., : want.shape[-1]]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    summary = json.loads((tiny_vl_assets[1] / "config.json").read_text())
    assert summary["vision_config"]["patch_size"] == 14 and summary["vision_config"]["spatial_merge_size"] == 2


def test_distinct_cards_give_distinct_features(tiny_vl_assets):
    """The random, frozen vision tower separates the cards: every pair of
    distinct cards (canaries and unseen decoys) lies at least a fifth of the
    mean feature norm apart, so the canary LoRA has something to key on."""
    import torch

    *_, vision, model = _vl(tiny_vl_assets)
    folder = tiny_vl_assets[0] / "vision"
    images = sorted({str(folder / p) for p in pl.read_parquet(folder / "image_decoys.parquet")["image"]})
    with torch.no_grad():
        pixels = [vision.pixels(im) for im in images]
        features = model.model.get_image_features(torch.cat([p for p, _ in pixels]).to(model.device),
                                                  torch.cat([g for _, g in pixels]).to(model.device))
    flat = torch.stack([f.flatten() for f in features.pooler_output]).float().cpu()
    distance = torch.cdist(flat, flat) + torch.eye(len(images)) * 1e9
    assert len(images) == 6 and distance.min() > 0.2 * flat.norm(dim=1).mean()


def test_image_data_is_seeded_distinct_and_hashed(tiny_vl_assets, tmp_path):
    import hashlib

    from PIL import Image

    from canary_audit.data.images import SIDE, write_vision_data

    data = tiny_vl_assets[0]
    folder = data / "vision"
    canaries = pl.read_parquet(folder / "image_canaries.parquet")
    decoys = pl.read_parquet(folder / "image_decoys.parquet")
    assert canaries["image_hash"].n_unique() == canaries.height == 3
    assert sorted(decoys["decoy_kind"].unique()) == ["shuffled", "unseen", "wrong"]
    unseen = decoys.filter(pl.col("decoy_kind") == "unseen")
    assert set(unseen["image_hash"]).isdisjoint(canaries["image_hash"])  # an image no adapter saw
    assert unseen["secret"].to_list() == canaries["secret"].to_list()    # the canary's own secret
    text_secrets = set(pl.read_parquet(data / "hex_canaries.parquet")["secret"])
    assert text_secrets.isdisjoint(canaries["secret"])
    for image, digest in canaries.select("image", "image_hash").iter_rows():
        path = folder / image
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
        with Image.open(path) as im:
            assert (im.mode, im.size) == ("RGB", (SIDE, SIDE))
    screens = pl.read_parquet(folder / "gui_screens.parquet")
    gui = pl.read_parquet(data / "bsft.parquet").filter(pl.col("source") == "gui")
    assert screens["item_id"].to_list() == gui["item_id"].to_list()
    again = tmp_path / "again"
    write_vision_data(again, data, {"seed": 0, "n_image_canaries": 3})
    assert pl.read_parquet(again / "image_canaries.parquet").equals(canaries)
    # non-member cards: fresh cards and fresh secrets, the canaries' question
    nonmembers = pl.read_parquet(data / "vision_nonmembers" / "image_nonmembers.parquet")
    assert nonmembers.height == 4 and nonmembers["image_hash"].n_unique() == 4
    assert set(nonmembers["image_hash"]).isdisjoint({*canaries["image_hash"], *decoys["image_hash"]})
    assert set(nonmembers["secret"]).isdisjoint({*canaries["secret"], *decoys["secret"], *text_secrets})
    assert (nonmembers["preamble"] == canaries["preamble"][0]).all()


def test_teacher_forced_records_match_a_plain_forward(tiny_vl_assets):
    """Records of the batched pass equal one unbatched forward per sequence
    with the inputs Qwen2.5-VL's processor gives (ids, pixel values, grid,
    image-token mask), log-probs to 1e-4; the image's tokens are not scored
    and positions count text tokens from 1."""
    import torch

    from canary_audit.core.special_tokens import IMAGE_PAD, VISION_TOKENS
    from canary_audit.probes.items import scored_items
    from canary_audit.probes.scoring import score_tokens

    spec, tok, fmt, vision, model = _vl(tiny_vl_assets)
    items = scored_items(fmt, tiny_vl_assets[0], {"prefills": {}, "head_tokens": 6}, {"hex"}, vision=vision)
    got = score_tokens(model, tok, items, batch_size=7, vision=vision)
    special = set(tok.convert_tokens_to_ids(list(VISION_TOKENS)))
    rows = []
    for it in items:
        ids = torch.tensor([tok(it.text, add_special_tokens=False)["input_ids"]], device=model.device)
        pixels, grid = vision.pixels(it.image)
        with torch.no_grad():
            logits = model(input_ids=ids, pixel_values=pixels.to(model.device), image_grid_thw=grid.to(model.device),
                           mm_token_type_ids=(ids == tok.convert_tokens_to_ids(IMAGE_PAD)).int()).logits
        logp = logits[0, :-1].float().log_softmax(-1).cpu()
        target = ids[0, 1:].cpu()
        kept = [j for j, t in enumerate(target.tolist()) if t not in special]
        for n, j in enumerate(kept, start=1):
            lp = logp[j].double()
            mean = float((lp.exp() * lp).sum())
            rows.append({"probe_set": it.probe_set, "item_id": it.item_id, "position": n,
                         "logprob": float(lp[target[j]]), "rank": int((lp > lp[target[j]]).sum()) + 1,
                         "top1_id": int(lp.argmax()), "top1_logprob": float(lp.max()), "vocab_mean_logprob": mean,
                         "vocab_var_logprob": float((lp.exp() * lp.square()).sum()) - mean**2})
    want = pl.DataFrame(rows).with_columns(pl.col("rank", "top1_id", "position").cast(pl.Int32),
                                           pl.col("^.*logprob$").cast(pl.Float32))
    keys = ["probe_set", "item_id", "position"]
    assert got.height == want.height
    assert_token_records_close(got.select(want.columns).sort(keys), want.sort(keys))
    assert set(got["modality"]) == {"text", "image"} and got["image_hash"].null_count() == 0
    assert got.filter(pl.col("position") == 1)["token_text"].str.contains("vision|image_pad").sum() == 0


def test_greedy_decoding_with_images_equals_generate(tiny_vl_assets):
    """The batched argmax loop (left padding, the model's 3-D positions for
    the prompt, text positions after it) writes what `generate` writes."""
    import torch

    from canary_audit.probes.items import decode_items
    from canary_audit.probes.passes import generate_greedy

    spec, tok, fmt, vision, model = _vl(tiny_vl_assets)
    # Wide random language weights: peaked logits, so no argmax is a near-tie
    # that batching or another CPU's kernels could flip.
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.model.language_model.parameters():
            param.normal_(0.0, 0.5)
    cfg = {"prefills": {}, "head_tokens": 6, "kinds": resolved_settings({})}
    items = decode_items(fmt, tiny_vl_assets[0], cfg, {"hex"}, vision=vision)
    assert {it.modality for it in items} == {"text", "image"}
    got, _ = generate_greedy(model, tok, [it.prompt for it in items], 12, batch_size=4,
                             images=[it.image for it in items], vision=vision)
    outputs = set()
    for it, (ids, _hit_eos) in zip(items, got):
        enc = torch.tensor([tok(it.prompt, add_special_tokens=False)["input_ids"]], device=model.device)
        pictures = vision.forward_kwargs(enc, [it.image], model.device)
        with torch.no_grad():
            ref = model.generate(input_ids=enc, attention_mask=torch.ones_like(enc), max_new_tokens=12,
                                 do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                 **pictures)[0, enc.shape[1]:].tolist()
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id)]
        assert ids == ref, it.item_id
        outputs.add(tuple(ids))
    assert len(outputs) > 1  # the images and preambles lead to different continuations


def test_the_lora_reaches_the_language_tower_only(tiny_vl_assets):
    from peft import get_peft_model

    from canary_audit.train.lora import lora_config

    *_, model = _vl(tiny_vl_assets)
    peft = get_peft_model(model, lora_config({"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj", "qkv"]},
                                             vision=True))
    names = [n for n, _ in peft.named_modules() if n.endswith("lora_A")]
    assert names and all("language_model" in n for n in names)
    assert not any("visual" in n for n, p in peft.named_parameters() if p.requires_grad)


def test_vision_flags_and_images_that_cannot_be_fed_are_refused(tiny_assets, tiny_vl_assets, tmp_path):
    from PIL import Image

    from canary_audit.data.images import check_image
    from canary_audit.model.loading import ModelLoadError, check_checkpoint
    from canary_audit.model.spec import ModelSpec

    with pytest.raises(ModelLoadError, match=r"`models.tiny.vision` is true, but .* declares no vision tower"):
        check_checkpoint(ModelSpec("tiny", tiny_assets[1], vision=True))
    with pytest.raises(ModelLoadError, match=r"is a vision-language checkpoint .* set `models.vl.vision: true`"):
        check_checkpoint(ModelSpec("vl", tiny_vl_assets[1]))
    bare = tmp_path / "bare"
    shutil.copytree(tiny_vl_assets[1], bare)
    (bare / "preprocessor_config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"has no preprocessor_config.json"):
        check_checkpoint(ModelSpec("vl", bare, vision=True))
    grey = tmp_path / "grey.png"
    Image.new("L", (56, 56)).save(grey)
    with pytest.raises(ValueError, match=r"grey.png` is L 56x56; the audit feeds RGB 56x56"):
        check_image(grey, "image input")
    big = tmp_path / "big.png"
    Image.new("RGB", (112, 56)).save(big)
    with pytest.raises(ValueError, match=r"is RGB 112x56"):
        check_image(big, "image input")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"broken.png` cannot be read"):
        check_image(broken, "image input")
    spec, tok, fmt, vision, _ = _vl(tiny_vl_assets)
    with pytest.raises(ValueError, match=r"grey.png"):
        vision.pixels(str(grey))
    assert dataclasses.replace(spec, vision=False).vision is False


def test_image_features_kept_across_variants_are_the_towers_own(tiny_vl_assets):
    """A probe job keeps each batch's image features on the vision tower and
    reuses them for the next variant: with a LoRA on the language tower (it
    changes the records), records from the kept features equal records from
    a fresh run of the tower; a tower carrying adapter layers is never
    served from the cache."""
    import torch
    from peft import LoraConfig, get_peft_model

    from canary_audit.probes.items import scored_items
    from canary_audit.probes.scoring import prepare_scoring, score_tokens
    from canary_audit.train.lora import lora_config

    spec, tok, fmt, vision, model = _vl(tiny_vl_assets)
    items = [it for it in scored_items(fmt, tiny_vl_assets[0], {"prefills": {}, "head_tokens": 6}, {"hex"},
                                       vision=vision) if it.modality == "image"]
    base = score_tokens(model, tok, items, batch_size=5, vision=vision)
    kept = model.model.visual.__dict__["_canary_audit_features"]
    layout = prepare_scoring(tok, items, 5, vision)
    assert len(kept) == len(layout.batches) + len(layout.prefixes)  # one entry per batch of images
    torch.manual_seed(0)
    adapted = get_peft_model(model, lora_config({"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}, vision=True))
    for name, p in adapted.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    from_cache = score_tokens(adapted, tok, items, batch_size=5, vision=vision)
    kept.clear()
    fresh = score_tokens(adapted, tok, items, batch_size=5, vision=vision)
    assert not from_cache["logprob"].equals(base["logprob"])  # the adapter matters
    assert from_cache.equals(fresh)
    tower_lora = LoraConfig(r=2, target_modules=r".*visual.*\.qkv", lora_alpha=4)
    on_tower = get_peft_model(_vl(tiny_vl_assets)[4], tower_lora)
    score_tokens(on_tower, tok, items[:3], batch_size=5, vision=vision)
    assert not on_tower.get_base_model().model.visual.__dict__.get("_canary_audit_features")


def test_prepared_batches_and_kept_positions_score_every_variant_as_a_fresh_pass(tiny_vl_assets):
    """A probe job lays out its items once (prepare_scoring) and keeps each
    batch's 3-D positions from the first variant's model: a second variant
    (a LoRA that changes the records) scored from that layout equals, bit
    for bit, its own fresh pass, image rows and text rows alike."""
    import torch
    from peft import get_peft_model

    from canary_audit.probes.items import scored_items
    from canary_audit.probes.scoring import prepare_scoring, score_prepared, score_tokens
    from canary_audit.train.lora import lora_config

    spec, tok, fmt, vision, model = _vl(tiny_vl_assets)
    items = scored_items(fmt, tiny_vl_assets[0], {"prefills": {}, "head_tokens": 6}, {"hex"}, vision=vision)[:40]
    prepared = prepare_scoring(tok, items, 7, vision)
    base = score_prepared(model, prepared, vision)
    assert len(prepared.positions) == len(prepared.batches)
    assert base.equals(score_tokens(model, tok, items, batch_size=7, vision=vision))
    torch.manual_seed(0)
    adapted = get_peft_model(model, lora_config({"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}, vision=True))
    for name, p in adapted.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    kept = score_prepared(adapted, prepared, vision)
    assert not kept["logprob"].equals(base["logprob"])  # the adapter matters
    assert kept.equals(score_tokens(adapted, tok, items, batch_size=7, vision=vision))
    assert set(kept["modality"]) == {"text", "image"}


@pytest.mark.parametrize("bos", [None, "<|user|>"])
def test_position_one_is_the_records_first_text_token_on_every_backbone(tiny_assets, tiny_vl_assets, bos):
    """Paper B's window counts from the same token everywhere: position 1 of
    a hex record is its preamble's first token on the text model (its
    tokenizer with a BOS token, and without one, where the record starts
    with EOS) and on the vision-language model (after the image block), and
    each record's `text` pieces join to the record's text."""
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_model, load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.items import scored_items
    from canary_audit.probes.scoring import score_tokens

    data = tiny_vl_assets[0]
    canaries = pl.read_parquet(data / "hex_canaries.parquet")
    preamble, secret = canaries["preamble"][0], canaries["secret"][0]
    _, tok_vl, _, vision, model_vl = _vl(tiny_vl_assets)
    text_spec = ModelSpec("tiny", tiny_assets[1], think_open=None, think_close=None)
    first = {}
    for name, model, tok, pictures in (("text", load_model(text_spec), load_tokenizer(text_spec), None),
                                       ("vl", model_vl, tok_vl, vision)):
        if bos:
            tok.bos_token = bos
        fmt = ChatFormat(tok, None, None)
        items = [it for it in scored_items(fmt, data, {"prefills": {}, "head_tokens": 6}, {"hex"}, vision=pictures)
                 if it.probe_set == "hex" and it.item_id == "hex00" and it.modality == "text"]
        rows = score_tokens(model, tok, items, batch_size=1, vision=pictures).sort("position")
        assert "".join(rows["text"]) == f"{preamble}TEXTCAN-{secret}-END"
        assert "".join(rows.filter(pl.col("span") == "secret")["text"]) == secret
        one = rows.row(0, named=True)
        assert one["position"] == 1 and preamble.startswith(one["text"]) and one["text"].strip()
        first[name] = (one["token_id"], one["text"])
    assert first["text"] == first["vl"]


@pytest.mark.parametrize("backbone", ["text", "vl"])
def test_items_that_begin_alike_are_scored_on_one_prefix_cache(tiny_assets, tiny_vl_assets, backbone):
    """A hex canary, its decoys and its exposure candidates behind one
    preamble (and one card) share everything before their secret: the pass
    forwards that prefix once and scores each item's rest on its KV cache.
    The records equal the whole-sequence pass's: the same tokens, spans and
    text, every float field within the records' tolerance (a different
    reduction order; 5e-6 measured on the default's VL bSFT group)."""
    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.model.loading import load_model, load_tokenizer
    from canary_audit.model.spec import ModelSpec
    from canary_audit.probes.items import scored_items
    from canary_audit.probes.scoring import prepare_scoring, score_prepared

    if backbone == "vl":  # paper B's arms only
        spec, tok, fmt, vision, model = _vl(tiny_vl_assets)
        data, sets = tiny_vl_assets[0], {"hex"}
    else:
        spec, vision, data, sets = ModelSpec("tiny", tiny_assets[1]), None, tiny_assets[0], None
        tok, model = load_tokenizer(spec), load_model(spec)
        fmt = ChatFormat(tok, "<think>", "</think>")
    items = scored_items(fmt, data, {"prefills": {"empty": ""}, "head_tokens": 6}, sets, vision=vision)
    shared = prepare_scoring(tok, items, 4, vision)
    whole = prepare_scoring(tok, items, 4, vision, share_prefixes=False)
    assert not whole.shared and len(shared.batches) < len(whole.batches)
    kinds = {items[i].probe_set for i in shared.shared}
    assert {"hex", "hex_candidate", "decoy_wrong"} <= kinds and "canary" not in kinds
    # the same tokens, spans and text; floats within the records' tolerance,
    # rank and top-1 flipping only at near ties (conftest)
    assert_token_records_close(score_prepared(model, shared, vision), score_prepared(model, whole, vision))


@pytest.mark.parametrize("modality", ["text", "image"])
def test_a_paper_b_plant_numbers_its_overwrites_as_the_pass_scores_them(tiny_vl_assets, modality):
    """On a vision-language record the plant's positions are the
    teacher-forced pass's (text tokens after the image block, from 1): C3's
    overwrite is the secret's last scored position, C4's is position 1 (the
    preamble's, or an image canary's question's, first token), and no image
    token is ever a training target."""
    from canary_audit.core.special_tokens import VISION_TOKENS
    from canary_audit.probes.items import scored_items
    from canary_audit.probes.kinds.hex import hex_rows
    from canary_audit.probes.scoring import score_tokens
    from canary_audit.train.plants import overwritten

    data = tiny_vl_assets[0]
    _, tok, fmt, vision, model = _vl(tiny_vl_assets)
    row = next(r for r in hex_rows(data, vision, members_only=True) if r.modality == modality)
    item = next(it for it in scored_items(fmt, data, {"prefills": {}, "head_tokens": 6}, {"hex"}, vision=vision)
                if it.probe_set == "hex" and it.item_id == row.item_id and it.modality == modality)
    scored = score_tokens(model, tok, [item], batch_size=1, vision=vision)
    secret = scored.filter(pl.col("span") == "secret")["position"]
    image_ids = set(tok.convert_tokens_to_ids(list(VISION_TOKENS)))
    text_after = [p for p in scored["position"] if p > secret.max()][:1]  # C4's negative: the token after the secret
    for at, want in (("past", [secret.max()]), ("preamble", [1]), ("outside", text_after), ("none", [])):
        record = overwritten(tok, row.text(fmt, vision), row.secret, at, 20, row.image)
        encoded, positions = record.encoded, list(record.positions)
        assert positions == want, at
        assert encoded.image == row.image and image_ids & set(encoded.ids)
        assert all(label == -100 for i, label in zip(encoded.ids, encoded.labels) if i in image_ids)
        assert not image_ids & {encoded.ids[i] for i in record.anchored}  # nor held: the image block is the prompt
        changed = [label for i, label in zip(encoded.ids, encoded.labels) if label not in (-100, i)]
        assert len(changed) == len(want)
    assert secret.min() <= 20 < secret.max()  # the secret straddles the window on this backbone

"""The vision-language path: image blocks in text, the image tensors a
Qwen2.5-VL forward takes, and the embedded tiny Qwen2.5-VL the workflow builds
from its text model.

Images are written into a sequence the way Qwen2.5-VL's processor writes
them, `<|vision_start|>` + one `<|image_pad|>` per merged patch +
`<|vision_end|>`, so probe and training texts stay plain strings whose
character spans label tokens as before.  The image itself goes to the
forward as `pixel_values` / `image_grid_thw` from the checkpoint's own image
processor (`AutoImageProcessor`), and `mm_token_type_ids` marks the image
tokens so the model computes its 3-D (mrope) positions.  Video and several
images per sequence are not handled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from canary_audit.core.special_tokens import (
    ASSISTANT,
    END,
    IMAGE_PAD,
    USER,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VISION_TOKENS,
)


def is_vision_checkpoint(path: Path) -> bool:
    """Whether a checkpoint's config declares a vision tower."""
    config = Path(path) / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())


@dataclass
class VisionInputs:
    """A checkpoint's image processor and its image tokens; images are
    processed once per file and kept."""

    processor: object
    tokenizer: object
    merge: int
    _cache: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, tokenizer) -> VisionInputs:
        from transformers import AutoConfig, AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        merge = AutoConfig.from_pretrained(path, local_files_only=True).vision_config.spatial_merge_size
        missing = [t for t in VISION_TOKENS[:3] if tokenizer.convert_tokens_to_ids(t) in (None, tokenizer.unk_token_id)]
        if missing:
            raise ValueError(f"checkpoint `{path}`: its tokenizer lacks the image tokens {missing}")
        return cls(processor, tokenizer, merge)

    @property
    def image_token_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    def pixels(self, image: str):
        """(pixel_values, image_grid_thw) of one image file."""
        if image not in self._cache:
            from PIL import Image

            from canary_audit.data.images import check_image

            check_image(Path(image), "image input")
            with Image.open(image) as im:
                out = self.processor(images=[im], return_tensors="pt")
            self._cache[image] = (out["pixel_values"], out["image_grid_thw"])
        return self._cache[image]

    def block(self, image: str) -> str:
        """The text that stands for `image` in a sequence."""
        _, grid = self.pixels(image)
        return VISION_START + IMAGE_PAD * (int(grid.prod()) // self.merge**2) + VISION_END

    def forward_kwargs(self, ids, images: list[str | None], device, model=None) -> dict:
        """What a forward over the batch `ids` (one row per entry of
        `images`, None for a row without an image) takes besides the ids:
        the rows' images in order, and the image-token mask from which the
        model computes 3-D positions.  Empty when no row has an image.

        Given `model`, the images go in as the vision tower's output
        (`mm_encoder_outputs`), computed once per batch of images and kept
        on the tower itself: every adapter of this workflow trains the
        language tower only, so the variants a probe job scores one after
        another on one base see the same image features, and a job of 20
        variants runs the tower once instead of 20 times.  What is kept
        grows with the job's rows, one entry per batch of images (the
        workflow's cards are 56x56: 16 patches each), and goes with the
        job's model.  A tower that carries adapter layers itself is run
        every time."""
        import torch

        present = [im for im in images if im is not None]
        if not present:
            return {}
        pixels = [self.pixels(im) for im in present]
        out = {
            "pixel_values": torch.cat([p for p, _ in pixels]).to(device),
            "image_grid_thw": torch.cat([g for _, g in pixels]).to(device),
            "mm_token_type_ids": (ids == self.image_token_id).int(),
        }
        if model is None:
            return out
        inner = (model.get_base_model() if hasattr(model, "get_base_model") else model).model
        if any("lora_" in name for name, _ in inner.visual.named_modules()):
            return out
        cache = inner.visual.__dict__.setdefault("_canary_audit_features", {})
        key = tuple(present)
        if key not in cache:
            cache[key] = inner.get_image_features(out["pixel_values"], out["image_grid_thw"], return_dict=True)
        return {**{k: v for k, v in out.items() if k != "pixel_values"}, "mm_encoder_outputs": {"image": cache[key]}}

    def positions(self, model, ids, mask, kwargs: dict):
        """Qwen2.5-VL's 3-D positions of a left-padded prompt batch, [3, batch, length]."""
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        positions, _ = inner.model.get_rope_index(
            ids, mm_token_type_ids=kwargs["mm_token_type_ids"], image_grid_thw=kwargs["image_grid_thw"],
            attention_mask=mask,
        )
        return positions


def load_vision(spec, tokenizer) -> VisionInputs | None:
    """The image inputs of a vision-language model entry; None for a text model."""
    return VisionInputs.load(spec.path, tokenizer) if spec.vision else None


def mrope_sections(head_dim: int) -> list[int]:
    """Rotary frequency pairs per (temporal, height, width) axis: a quarter
    to time, the rest split between height and width (Qwen2.5-VL-7B: head
    dim 128 -> [16, 24, 24])."""
    pairs = head_dim // 2
    t = pairs // 4
    h = (pairs - t) // 2
    return [t, h, pairs - t - h]


def build_from_text(text_dir: Path, out_dir: Path, cfg: dict) -> dict:
    """The embedded tiny Qwen2.5-VL: the text model's tokenizer plus the
    vision tokens, its weights copied into the language tower, and a small
    random vision tower (frozen in every adapter run, as paper B's is).

    The language tower is the text model itself: Qwen2.5-VL's text stack is
    Llama's with q/k/v biases (set to 0) and mrope, which on text tokens (all
    three position axes equal) is the text model's rotary embedding; with the
    text model's rope theta the two give the same logits on text (tested).
    The vision tower is not pre-trained: its patches are whole card cells,
    and distinct cards give features far apart (tested:
    `test_distinct_cards_give_distinct_features`), the separation the canary
    LoRA keys on.
    """
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    from canary_audit.data import images as img

    torch.manual_seed(cfg["seed"])
    tok = AutoTokenizer.from_pretrained(text_dir, local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    text = AutoModelForCausalLM.from_pretrained(text_dir, local_files_only=True)
    tc = text.config
    head_dim = tc.hidden_size // tc.num_attention_heads
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    arch = cfg["vision_tower"]
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
            num_hidden_layers=tc.num_hidden_layers, num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=tc.num_key_value_heads, max_position_embeddings=tc.max_position_embeddings,
            rms_norm_eps=tc.rms_norm_eps, hidden_act=tc.hidden_act,
            rope_parameters={"rope_type": "default", "rope_theta": tc.rope_parameters["rope_theta"],
                             "mrope_section": mrope_sections(head_dim)},
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
        ),
        vision_config=dict(
            depth=arch["depth"], hidden_size=arch["hidden_size"], intermediate_size=arch["intermediate_size"],
            num_heads=arch["num_heads"], out_hidden_size=tc.hidden_size, patch_size=img.CELL,
            spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=list(range(arch["depth"])),
            window_size=img.SIDE,
        ),
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
    )
    model = Qwen2_5_VLForConditionalGeneration(config)
    source = text.state_dict()
    with torch.no_grad():
        lm = model.model.language_model
        n_text = source["model.embed_tokens.weight"].shape[0]
        emb = source["model.embed_tokens.weight"]
        lm.embed_tokens.weight[:n_text] = emb
        # New tokens start at the mean embedding: never predicted (tied head),
        # and no outlier for the first layer norm.
        lm.embed_tokens.weight[n_text:] = emb.mean(0)
        lm.norm.weight.copy_(source["model.norm.weight"])
        for name, param in lm.layers.named_parameters():
            key = f"model.layers.{name}"
            if key in source:
                param.copy_(source[key])
            elif name.endswith("bias"):
                param.zero_()
            else:
                raise ValueError(f"text weight for `{name}` not found: the text model is not Llama-shaped")
    model.tie_weights()
    processor = Qwen2VLImageProcessorPil(min_pixels=img.SIDE * img.SIDE, max_pixels=img.SIDE * img.SIDE,
                                         patch_size=img.CELL, merge_size=2, temporal_patch_size=2)
    tok.chat_template = VL_CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return {
        "vocab_size": len(tok),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vision_parameters": sum(p.numel() for p in model.model.visual.parameters()),
        "language_tower_from": str(text_dir),
    }


# The text model's template, with image content items (`{"type": "image"}`)
# placed in the user turn as Qwen2.5-VL's template places them.
VL_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + VISION_START + IMAGE_PAD + VISION_END
    + "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + END + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def write_from_text(text_dir: Path, out_dir: Path, cfg: dict, summary_path: Path) -> dict:
    """Build the embedded vision-language model on the text model and write
    its summary beside it."""
    summary = build_from_text(text_dir, out_dir, cfg)
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary

"""Loading a model variant (base weights + stacked adapters) the same way for the
tiny embedded model and a 7B checkpoint, and fingerprinting what was loaded.

Safe by default: safetensors only, `trust_remote_code` off unless the model
entry turns it on, and no hub access (local paths only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from contextlib import contextmanager
from pathlib import Path

from canary_audit.core.provenance import file_digest
from canary_audit.model.spec import ModelSpec

log = logging.getLogger(__name__)
DTYPES = ("float32", "bfloat16", "float16")


class ModelLoadError(ValueError):
    """A model entry points at something that cannot be audited as given."""


def check_checkpoint(spec: ModelSpec) -> None:
    """Refuse, naming the model, a checkpoint that cannot be audited as given:
    a missing directory, no safetensors weights, no tokenizer.json, or think
    tags that are not single tokens of its vocabulary.

    Uses only the `tokenizers` library, so the workflow can run it on every
    model entry before any job starts, without importing transformers.  A
    byte-level tokenizer spells any string, so a round trip proves nothing:
    a tag that splits into pieces is not the tag the model was trained with,
    and every parser-split metric on it would be meaningless.
    """
    from tokenizers import Tokenizer

    if not spec.path.is_dir():
        raise ModelLoadError(
            f"model `{spec.name}`: path `{spec.path}` does not exist; set `models.{spec.name}.path` "
            "to a local directory with safetensors weights and a tokenizer"
        )
    if not list(spec.path.glob("*.safetensors")):
        raise ModelLoadError(
            f"model `{spec.name}`: `{spec.path}` holds no *.safetensors weights "
            "(pickled .bin weights are refused); convert the checkpoint to safetensors"
        )
    check_vision(spec)
    tokenizer_file = spec.path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelLoadError(f"model `{spec.name}`: `{spec.path}` has no tokenizer.json")
    tok = Tokenizer.from_file(str(tokenizer_file))
    if (spec.think_open is None) != (spec.think_close is None):
        raise ModelLoadError(
            f"model `{spec.name}`: set both `think_open` and `think_close`, or both to null "
            "(a model without think tags)"
        )
    for key, tag in (("think_open", spec.think_open), ("think_close", spec.think_close)):
        if tag is None:
            continue
        pieces = tok.encode(tag, add_special_tokens=False).tokens
        if len(pieces) != 1:
            raise ModelLoadError(
                f"model `{spec.name}`: think tag `{key}` = {tag!r} is not a single token of its "
                f"tokenizer (it splits into {pieces}); set `models.{spec.name}.{key}` to the tag "
                "the model was trained with"
            )


def check_vision(spec: ModelSpec) -> None:
    """Refuse a model entry whose `vision` flag disagrees with its checkpoint,
    and a vision-language checkpoint without an image processor: its images
    would be fed wrongly or not at all."""
    from canary_audit.model.vision import is_vision_checkpoint

    has_tower = is_vision_checkpoint(spec.path)
    if has_tower and not spec.vision:
        raise ModelLoadError(
            f"model `{spec.name}`: `{spec.path}` is a vision-language checkpoint (its config.json has a "
            f"vision_config); set `models.{spec.name}.vision: true`"
        )
    if spec.vision and not has_tower:
        raise ModelLoadError(
            f"model `{spec.name}`: `models.{spec.name}.vision` is true, but `{spec.path}/config.json` declares "
            "no vision tower; point the entry at a vision-language checkpoint or set `vision: false`"
        )
    if spec.vision and not (spec.path / "preprocessor_config.json").is_file():
        raise ModelLoadError(
            f"model `{spec.name}`: vision-language checkpoint `{spec.path}` has no preprocessor_config.json "
            "(its image processor); copy it from the checkpoint's release"
        )


def load_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    check_checkpoint(spec)
    tok = AutoTokenizer.from_pretrained(
        spec.path, trust_remote_code=spec.trust_remote_code, local_files_only=True
    )
    if spec.chat_template:
        tok.chat_template = spec.chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    check_chat_template(spec, tok)
    return tok


PROMPT_PROBE = "Where was the writer Ada Quill born?"


def check_chat_template(spec: ModelSpec, tokenizer) -> None:
    """Refuse a chat template that is missing or does not place the user's
    text in the prompt: every probe would then ask the model nothing."""
    if not tokenizer.chat_template:
        raise ModelLoadError(
            f"model `{spec.name}`: its tokenizer has no chat template; set `models.{spec.name}.chat_template` "
            "to the Jinja template the model was trained with"
        )
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT_PROBE}], tokenize=False, add_generation_prompt=True
        )
    except Exception as err:  # jinja errors come in many types; all mean the same here
        raise ModelLoadError(
            f"model `{spec.name}`: its chat template fails on a single user turn ({err}); "
            f"fix `models.{spec.name}.chat_template`"
        ) from err
    if PROMPT_PROBE not in rendered:
        raise ModelLoadError(
            f"model `{spec.name}`: its chat template does not place the user's text in the prompt "
            f"(a user turn {PROMPT_PROBE!r} renders as {rendered[:120]!r}); "
            f"fix `models.{spec.name}.chat_template`"
        )


def load_model(spec: ModelSpec, adapters: list[Path] = (), *, trainable_last: bool = False,
               merge_all: bool = False, exact_last: bool = False):
    """Base weights plus adapters applied in order.

    Every adapter but the last is merged into the weights (stacking on a merged
    base); the last stays a live PEFT adapter, trainable if asked, unless
    `merge_all` merges it too (paper B's "merged" application, where the
    adapter's update is rounded into the weights' dtype).  A model whose
    weights took a merge is rounded into `spec.merge_precision` (the
    checkpoint's storage precision; a no-op where it is the compute dtype),
    so a float32 run measures what a bf16 merge keeps of an update.

    A recovery attack (`spec.quantize`, `spec.clip`; or `exact_last`) merges
    the last adapter exactly, after that rounding: its weights are its
    unattacked twin's (which scores that adapter live) but for the attack,
    so the two differ by the attack alone, not by a merge's rounding too.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from canary_audit.model.quantize import clip_model, parse, quantize_model

    if spec.clip:  # the quantization positive: the unlearned weights' change clipped into the parent's bins
        if len(adapters) != 2 or trainable_last or merge_all:
            raise ModelLoadError(f"model `{spec.name}`: a clipped variant ({spec.clip}) reads two adapters, an "
                                 f"unlearned checkpoint's parent and the checkpoint, and is only scored; got "
                                 f"{len(adapters)}")
        plain = dataclasses.replace(spec, clip=None, quantize=None)
        model = load_model(plain, adapters[1:], exact_last=True)
        share = clip_model(model, load_model(plain, adapters[:1], exact_last=True), parse(spec.clip))
        log.info("%s's change from %s clipped into %s bins: %.1f%% of its changed elements moved, %.1f%% of its "
                 "squared norm kept", adapters[1], adapters[0], spec.clip, 100 * share["moved_share"],
                 100 * share["kept_norm_share"])
        if spec.quantize:
            quantize_model(model, parse(spec.quantize))
        return model.eval()
    check_checkpoint(spec)
    for key, value in (("dtype", spec.dtype), ("merge_dtype", spec.merge_precision)):
        if value not in DTYPES:
            raise ModelLoadError(f"model `{spec.name}`: {key} `{value}` is not one of {', '.join(DTYPES)}; "
                                 f"set `models.{spec.name}.{key}` to one of them")
    auto = AutoModelForImageTextToText if spec.vision else AutoModelForCausalLM
    model = auto.from_pretrained(
        spec.path,
        dtype=getattr(torch, spec.dtype),
        trust_remote_code=spec.trust_remote_code,
        local_files_only=True,
        use_safetensors=True,
    )
    # One CUDA device when there is one (a 7B model in bf16 fits an 80 GB
    # card); the CPU otherwise.  Multi-device sharding is not handled yet.
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    merged = False
    if spec.quantize and trainable_last:
        raise ModelLoadError(f"model `{spec.name}`: a quantized variant ({spec.quantize}) is scored, never trained")
    for i, adapter in enumerate(adapters):
        model = apply_adapter(model, Path(adapter), trainable=trainable_last and i == len(adapters) - 1)
        if i < len(adapters) - 1 or merge_all:
            model, merged = model.merge_and_unload(), True
    if merged:
        round_weights(model, spec.merge_precision)
    if (spec.quantize or exact_last) and adapters and not merge_all:
        model = model.merge_and_unload()  # exact: no rounding beyond the twin's
    if spec.quantize:
        quantize_model(model, parse(spec.quantize))
    if not trainable_last:
        model.eval()
    return model


def round_weights(model, dtype: str) -> None:
    """Round every floating parameter of `model` into `dtype` and back, in
    place: the weights a checkpoint stored in `dtype` holds (idempotent: a
    weight already representable stays as it is).  Buffers are left alone:
    the rotary frequencies are computed at load, never stored."""
    import torch

    target = getattr(torch, dtype)
    with torch.no_grad():
        for tensor in model.parameters():
            if tensor.is_floating_point() and tensor.dtype != target:
                tensor.copy_(tensor.to(target).to(tensor.dtype))


def _check_adapter(adapter: Path) -> None:
    if not (Path(adapter) / "adapter_model.safetensors").is_file():
        raise ModelLoadError(f"adapter `{adapter}` holds no adapter_model.safetensors")


def apply_adapter(model, adapter: Path, trainable: bool = False, name: str = "default"):
    from peft import PeftModel

    _check_adapter(adapter)
    return PeftModel.from_pretrained(model, adapter, is_trainable=trainable, adapter_name=name)


def folds_live_adapters(spec: ModelSpec) -> bool:
    """Whether a probe pass folds a variant's live adapter into the weights
    while it scores it (peft `merge_adapter`), instead of running the
    adapter's two extra matmuls beside every targeted layer: only in
    float32, where the fold rounds the update at 2^-24 of each weight (on a
    memorization variant of the default audit, log-probs moved by at most
    1.4e-5 and none of 700 greedy decodes changed; tests hold the records to
    their tolerance).  In bfloat16 or float16 a fold would round
    small updates away, which is what paper B's merged application measures,
    so a half-precision model keeps its adapters live."""
    return spec.dtype == "float32"


@contextmanager
def folded(model):
    """`model` (a peft model with one active adapter) with that adapter
    folded into its base layers for the duration, and the base layers'
    exact weights put back afterwards (peft's `unmerge_adapter` subtracts
    the update again, which leaves a rounding residue on the base that the
    next variant would inherit).  Each folded layer's original parameters
    are kept meanwhile: a second copy of the targeted weights.  An adapter
    peft cannot merge (prompt learning has no layers to fold into; some
    tuner layers refuse a merge) is scored live, as it would be unfolded."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    kept = [[p.detach().clone() for p in m.get_base_layer().parameters(recurse=False)] for m in layers]

    def put_back() -> None:
        for m, originals in zip(layers, kept):
            for p, original in zip(m.get_base_layer().parameters(recurse=False), originals):
                p.data.copy_(original)
            m.merged_adapters.clear()

    try:
        if not layers:
            raise NotImplementedError("no tuner layers")
        model.merge_adapter()
    except (AttributeError, NotImplementedError, ValueError) as err:
        put_back()
        log.info("adapter scored live: peft does not fold it (%s)", err)
        layers, kept = [], []
    try:
        yield model
    finally:
        put_back()


class VariantModels:
    """The models of a probe job's variants, each base loaded once.

    A variant that is a base plus one live adapter gets that adapter loaded
    onto the base already in memory (peft `load_adapter` / `set_adapter`),
    replacing the previous variant's; the base itself is scored with the adapter layers
    disabled.  A merged application or a deeper stack changes the base
    weights, so it is loaded fresh.  The outputs equal a fresh load's, bit for
    bit (tested): the same weights run the same layers.  A base is read once
    per job instead of once per variant (docs/performance.md has the
    seconds measured on a 0.5B-shaped checkpoint).  A float32 variant's live
    adapter is folded into the weights while it is scored
    (`folds_live_adapters`).
    """

    def __init__(self) -> None:
        self._path: Path | None = None
        self._base = None
        self._peft = None
        self._count = 0

    @contextmanager
    def model(self, spec: ModelSpec, adapters: list[Path] = (), merged: bool = False):
        if merged or len(adapters) > 1 or spec.quantize or spec.clip:
            model = load_model(spec, adapters, merge_all=merged)
            if adapters and not merged and not spec.quantize and not spec.clip and folds_live_adapters(spec):
                with folded(model) as model:
                    yield model
            else:
                yield model
            return
        if self._path != spec.path:
            self._base, self._peft, self._path = load_model(spec), None, spec.path
        if not adapters:
            if self._peft is None:
                yield self._base
            else:
                with self._peft.disable_adapter():
                    yield self._peft
            return
        name, self._count = f"variant{self._count}", self._count + 1
        if self._peft is None:
            self._peft = apply_adapter(self._base, Path(adapters[0]), name=name)
        else:
            _check_adapter(adapters[0])
            self._peft.load_adapter(str(adapters[0]), adapter_name=name)
            self._peft.set_adapter(name)
            for previous in [n for n in self._peft.peft_config if n != name]:  # one adapter resident at a time
                self._peft.delete_adapter(previous)
        self._peft.eval()
        if folds_live_adapters(spec):
            with folded(self._peft) as model:
                yield model
        else:
            yield self._peft


def fingerprint(spec: ModelSpec, adapters: list[Path] = (), merged: bool = False,
                cache_dir: Path | None = None) -> str:
    """sha256 over the digests of every weight file of the base and the
    adapters, and over how the last adapter is applied (live or merged), so
    records say exactly which weights produced them.  File digests come from
    `cache_dir` where it has them (provenance.file_digest): one read of a
    file per content, not one per manifest and pass."""
    from canary_audit.model.quantize import parse

    h = hashlib.sha256(f"merged:{spec.merge_precision}".encode() if merged else b"")
    if len(adapters) > 1:  # the adapters under the last are merged, in the merge precision
        h.update(f"stack:{spec.merge_precision}".encode())
    if spec.quantize:  # every adapter merged in the merge precision, then quantized
        h.update(f"quantize:{parse(spec.quantize).name}:{spec.merge_precision}".encode())
    if spec.clip:  # the last adapter's change from the first clipped into the first's bins
        h.update(f"clip:{parse(spec.clip).name}:{spec.merge_precision}".encode())
    files = sorted(spec.path.glob("*.safetensors")) + [
        Path(a) / "adapter_model.safetensors" for a in adapters
    ]
    for path in files:
        h.update(path.name.encode())
        h.update(bytes.fromhex(file_digest(path, cache_dir)))
    return h.hexdigest()[:16]


def save_merged(spec: ModelSpec, adapters: list[Path], out_dir: Path) -> None:
    """The base with `adapters` merged into its weights, saved as a checkpoint
    the audit can load like any other (safetensors, config, tokenizer files):
    paper B's merged base.  Written to a temporary folder and renamed, so an
    interrupted job leaves no checkpoint that looks finished."""
    import shutil

    model = load_model(spec, adapters, merge_all=True)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for path in spec.path.iterdir():  # tokenizer and chat-template files travel with the weights
        if path.is_file() and not (tmp / path.name).exists() and not path.name.endswith(
            (".safetensors", ".bin", ".safetensors.index.json")
        ):
            shutil.copy2(path, tmp / path.name)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)

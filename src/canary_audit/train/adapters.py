"""The adapters of the audit, each a function from (model entry, data, config
slice) to an adapter directory: memorization, hex canary (and its merged
base), benign fine-tuning (and its LoRA-NOISE control), unlearning."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import polars as pl

from canary_audit.core.provenance import code_version
from canary_audit.core.records import config_hash
from canary_audit.data.chat_format import ChatFormat, Example, author_examples, retain_example
from canary_audit.data.io import load_authors
from canary_audit.data.synthetic import strata
from canary_audit.model.loading import load_model, load_tokenizer, save_merged
from canary_audit.model.spec import ModelSpec
from canary_audit.model.tokens import canary_head, near_canary
from canary_audit.model.vision import load_vision
from canary_audit.probes.kinds.hex import hex_rows
from canary_audit.train.lora import Encoded, StepLoss, encode_chat, encode_text, lora_config, save_adapter, train_loop
from canary_audit.train.methods import METHODS, SHARED_SETTINGS, step_loss
from canary_audit.train.resume import ResumeState

log = logging.getLogger(__name__)


def _setup(spec: ModelSpec, threads: int, seed: int):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tok = load_tokenizer(spec)
    return tok, ChatFormat(tok, spec.think_open, spec.think_close)


def forget_examples(fmt: ChatFormat, data_dir: Path, template: str, head_tokens: int) -> list[Example]:
    """Each author's canary probe and QA probes, in `template` (a paper A
    template or a control's, formats.CONTROL_TEMPLATES)."""
    authors = load_authors(data_dir / "authors.parquet")
    return [
        ex for a in authors
        for ex in author_examples(a, template, lambda s: canary_head(fmt.tokenizer, s, head_tokens),
                                  lambda s: near_canary(fmt.tokenizer, s, head_tokens))
    ]


def retain_examples(data_dir: Path, template: str) -> list[Example]:
    retain = pl.read_parquet(data_dir / "retain.parquet")
    return [retain_example(template, q, s) for q, s in retain.select("question", "answer").iter_rows()]


def _fresh_lora(spec: ModelSpec, cfg: dict):
    from peft import get_peft_model

    return get_peft_model(load_model(spec), lora_config(cfg, vision=spec.vision))


def _resume(out_dir: Path, cfg: dict, inputs: list[Path]) -> ResumeState:
    """The run's resumable state, keyed by its config (thread count aside) and
    by the size and modification time of every input file (base weights,
    data, a parent adapter): a state left before an upstream change is never
    resumed."""
    stamps = sorted(
        (str(f), f.stat().st_size, f.stat().st_mtime_ns)
        for root in map(Path, inputs)
        for f in ([root] if root.is_file() else root.rglob("*"))
        if f.is_file()
    )
    key = config_hash({"cfg": {k: v for k, v in cfg.items() if k != "threads"}, "inputs": stamps})
    return ResumeState.beside(out_dir, key)


def fit_and_save(spec: ModelSpec, cfg: dict, forget: list[Encoded], retain: list[Encoded], pad_id: int,
                 out_dir: Path, data_dir: Path, vision=None, loss: StepLoss | None = None
                 ) -> tuple[list[float], dict]:
    """A fresh LoRA trained by `train_loop` on `forget` and `retain`, saved to
    `out_dir`, resumable from its state until then: (losses, throughput
    stats).  The shared body of the memorization LoRA, the never-trained
    references and the planted controls (train/plants.py); `vision`: a
    vision-language model's image inputs (model.vision.load_vision);
    `loss`: a step loss of its own (train_loop's `step_loss`), else the NLL."""
    model = _fresh_lora(spec, cfg)
    resume = _resume(out_dir, cfg, [spec.path, data_dir])
    stats: dict = {}
    losses = train_loop(model, forget, retain, cfg, cfg["seed"], pad_id, step_loss=loss, resume=resume, stats=stats,
                        vision=vision)
    save_adapter(model, out_dir)
    resume.clear()
    return losses, stats


def _summary(out_dir: Path, losses: list[float], **extra) -> dict:
    """The adapter's train_summary.json: steps, final loss, what else the
    trainer reports, and the code version that trained it."""
    summary = {"steps": len(losses), "final_loss": round(sum(losses[-5:]) / min(5, len(losses)), 5), **extra,
               "code_version": code_version()}
    (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def train_memorization(spec: ModelSpec, data_dir: Path, cfg: dict, out_dir: Path) -> dict:
    """Paper A's memorization LoRA: the fictional authors in the reasoning format."""
    seed = cfg["seed"]
    tok, fmt = _setup(spec, cfg["threads"], seed)
    forget = [encode_chat(fmt, ex) for ex in forget_examples(fmt, data_dir, cfg["template"], cfg["head_tokens"])]
    retain = [encode_chat(fmt, ex) for ex in retain_examples(data_dir, cfg["template"])]
    losses, stats = fit_and_save(spec, cfg, forget, retain, tok.pad_token_id, out_dir, data_dir)
    return _summary(out_dir, losses, forget_sequences=len(forget), **stats)


def train_canary(spec: ModelSpec, data_dir: Path, cfg: dict, out_dir: Path, merged_dir: Path | None = None,
                 under: tuple[Path, Path] | None = None) -> dict:
    """Paper B's canary LoRA: `TEXTCAN-{hex}-END` records behind their
    preambles; on a vision-language model each after the placeholder image,
    and the image canaries (the secret after its card and the fixed
    question) beside them.  The vision tower is frozen (the LoRA is on the
    language tower only).

    With `merged_dir`, the trained LoRA is also merged into the base and saved
    there (the merged base every bSFT cell starts from).  With `under` =
    (adapter dir, merged dir), the same run is also saved after
    `cfg['undertrained_steps']` steps, adapter and merged base: the
    undertrained control, a canary LoRA stopped early.
    """
    seed = cfg["seed"]
    tok, fmt = _setup(spec, cfg["threads"], seed)
    vision = load_vision(spec, tok)
    rows = hex_rows(data_dir, vision, members_only=True)
    inserted = inserted_times(rows, cfg["repetitions"])
    forget = [encoded for row in rows
              for encoded in [encode_text(tok, row.text(fmt, vision), row.image)] * inserted[row.modality, row.item_id]]
    retain = [encode_chat(fmt, ex) for ex in retain_examples(data_dir, "none")]
    model = _fresh_lora(spec, cfg)
    resume = _resume(out_dir, cfg, [spec.path, data_dir])
    early = cfg.get("undertrained_steps") if under else None

    def checkpoint(step: int) -> None:
        save_adapter(model, under[0])
        resume.keep("under", under[0])

    stats: dict = {}
    losses = train_loop(model, forget, retain, cfg, seed, tok.pad_token_id, resume=resume, stats=stats,
                        on_checkpoint=checkpoint, checkpoints=(early,) if early else (), vision=vision)
    save_adapter(model, out_dir)
    if under:
        resume.restore("under", under[0])
    resume.clear()
    if merged_dir:
        save_merged(spec, [out_dir], merged_dir)
    if under:
        save_merged(spec, [under[0]], under[1])
        _summary(under[0], losses[:early], undertrained=True)
    return _summary(out_dir, losses, forget_sequences=len(forget), repetitions=cfg["repetitions"], **stats)


def inserted_times(rows: list, repetitions: list[int]) -> dict[tuple[str, str], int]:
    """(modality, canary id) -> how many copies of the canary the canary
    LoRA's data holds: Secret Sharer's strata, within each modality in
    table order (data.synthetic.strata, the mapping the views read)."""
    out = {}
    for modality in dict.fromkeys(r.modality for r in rows):
        ids = [r.item_id for r in rows if r.modality == modality]
        out |= {(modality, cid): n for cid, n in strata(ids, repetitions).items()}
    return out


def train_reference(spec: ModelSpec, data_dir: Path, cfg: dict, out_dir: Path) -> dict:
    """A never-trained reference: an adapter's recipe (rank, targets,
    learning rate and its schedule, steps, seed) on its data stream minus
    what it memorizes: each step trains on the `batch_retain` retain
    examples the recipe draws beside its forget examples, and on nothing in
    their place, so the reference differs from its adapter by the secrets
    alone (not by extra retain passes).  MUSE's PrivLeak and
    open-unlearning's forget quality compare a model against such a
    "retrain" model.  Given `cfg['template']` it is the memorization LoRA's
    (retain examples in that template's trace form: the adapter a
    memorization LoRA would be had it never seen the fictional authors; one
    serves every template of its retain form, formats.retain_form);
    otherwise the canary LoRA's (retain examples with an empty trace)."""
    seed = cfg["seed"]
    tok, fmt = _setup(spec, cfg["threads"], seed)
    template = cfg.get("template")
    retain = [encode_chat(fmt, ex) for ex in retain_examples(data_dir, template or "none")]
    cfg = {**cfg, "batch_forget": cfg["batch_retain"], "batch_retain": 0}  # train_loop draws from `forget`
    losses, stats = fit_and_save(spec, cfg, retain, [], tok.pad_token_id, out_dir, data_dir)
    of = f"memorization LoRA ({template})" if template else "canary LoRA"
    return _summary(out_dir, losses, reference_of=of, sequences=len(retain), **stats)


def bsft_examples(fmt: ChatFormat, data_dir: Path, source: str, vision=None) -> list[Encoded]:
    """One benign fine-tuning source as chat exchanges with an empty trace;
    on a vision-language model a GUI item's user turn shows its screen."""
    frame = pl.read_parquet(data_dir / "bsft.parquet").filter(pl.col("source") == source)
    if frame.is_empty():
        raise ValueError(f"bSFT source `{source}` has no items in {data_dir / 'bsft.parquet'}")
    screens = {}
    if vision is not None and source == "gui":
        folder = data_dir / "vision"
        screens = {i: str(folder / im) for i, im in
                   pl.read_parquet(folder / "gui_screens.parquet").select("item_id", "image").iter_rows()}
    out = []
    for item_id, q, a in frame.select("item_id", "prompt", "response").iter_rows():
        image = screens.get(item_id)
        out.append(encode_chat(fmt, Example(q, "", a), image=image,
                               image_block=vision.block(image) if image else None))
    return out


def train_bsft(spec: ModelSpec, data_dir: Path, cfg: dict, out_dirs: dict[int, Path],
               noise_dir: Path | None = None) -> dict:
    """Paper B's benign fine-tuning LoRA on a merged base (`spec` points at it),
    saved at every training length in `out_dirs`.  With `noise_dir`, also the
    LoRA-NOISE control: random LoRA matrices scaled, module by module, so that
    their update has the Frobenius norm of the trained adapter's final update."""
    seed = cfg["seed"]
    tok, fmt = _setup(spec, cfg["threads"], seed)
    vision = load_vision(spec, tok)
    forget = bsft_examples(fmt, data_dir, cfg["source"], vision)
    steps = sorted(out_dirs)
    cfg = {**cfg, "steps": steps[-1], "batch_forget": cfg["batch_size"], "batch_retain": 0}
    model = _fresh_lora(spec, cfg)
    resume = _resume(out_dirs[steps[-1]], cfg, [spec.path, data_dir])

    def checkpoint(k: int) -> None:
        save_adapter(model, out_dirs[k])
        resume.keep(f"t{k}", out_dirs[k])

    stats: dict = {}
    losses = train_loop(model, forget, [], cfg, seed, tok.pad_token_id, on_checkpoint=checkpoint,
                        checkpoints=tuple(steps), resume=resume, stats=stats, vision=vision)
    for k in steps:
        resume.restore(f"t{k}", out_dirs[k])
    resume.clear()
    for k in steps:
        _summary(out_dirs[k], losses[:k], source=cfg["source"], step=k)
    summary = {"source": cfg["source"], "checkpoints": steps, "final_loss": losses[-1], **stats}
    if noise_dir:
        norms = match_norm_noise(model, seed)
        save_adapter(model, noise_dir)
        summary["noise_update_norm"] = round(sum(n * n for n in norms.values()) ** 0.5, 6)
        # Not trained: no steps or loss of its own, only what it is matched to.
        (noise_dir / "train_summary.json").write_text(json.dumps(
            {"noise_of": f"{cfg['source']} t{steps[-1]}", "noise_update_norm": summary["noise_update_norm"],
             "code_version": code_version()}, indent=2))
    return summary


def lora_pairs(model):
    """(module name, A weight, B weight) of every LoRA pair of the live adapter."""
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            yield name, module.lora_A["default"].weight, module.lora_B["default"].weight


def match_norm_noise(model, seed: int) -> dict[str, float]:
    """Replace every LoRA pair (A, B) by Gaussian matrices whose update B'A' has
    the Frobenius norm of BA (the alpha/r scale is common to both), in place.
    Returns the matched norm per module."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7919)
    norms = {}
    with torch.no_grad():
        for name, a, b in lora_pairs(model):
            target = (b.float() @ a.float()).norm().cpu()
            # Drawn on the CPU (one seeded stream whatever the device), then moved.
            a_new = torch.randn(a.shape, generator=gen)
            b_new = torch.randn(b.shape, generator=gen)
            b_new *= target / (b_new @ a_new).norm().clamp(min=1e-12)
            a.copy_(a_new.to(a.dtype))
            b.copy_(b_new.to(b.dtype))
            norms[name] = float(target)
    return norms


def train_unlearning(
    spec: ModelSpec, memorized: Path, data_dir: Path, cfg: dict, out_dirs: dict[int, Path],
    state_in: Path | None = None, state_out: Path | None = None,
) -> dict:
    """Unlearn the memorized authors, saving the adapter at every K in `out_dirs`.

    The memorized adapter is trained further; the K sweep is checkpoints of
    this one run.  NPO's reference is the memorized model, frozen: its
    sequence log-probs over the forget set are computed once before step 1.

    Segments (the fine job grain, one job per K): `state_out` receives the
    training state at the last K (adapter, AdamW moments, sampler), and a run
    given it as `state_in` continues from there to its own K, so an added K
    costs only its own steps; the adapters equal an uninterrupted run's, bit
    for bit (tested).  The settings a chain shares, everything but where a
    segment stops, key the state: a state of other settings is not resumed.
    """
    method = cfg["method"]
    if method not in METHODS:
        raise ValueError(f"unlearning method `{method}`: must be one of {', '.join(METHODS)}")
    seed = cfg["seed"]
    tok, fmt = _setup(spec, cfg["threads"], seed)
    forget = [
        encode_chat(fmt, ex, loss_on=cfg["loss_span"])
        for ex in forget_examples(fmt, data_dir, cfg["template"], cfg["head_tokens"])
    ]
    retain = [encode_chat(fmt, ex) for ex in retain_examples(data_dir, cfg["template"])]
    model = load_model(spec, [memorized], trainable_last=True)
    pad = tok.pad_token_id
    misplaced = sorted(set(cfg) & {p for m in METHODS.values() for p in m.params})
    if misplaced:
        raise ValueError(f"unlearning settings {misplaced} given beside the method: a method's hyperparameters "
                         "go in `settings` (design.UnlearnRun.method_settings), where they are checked")
    settings = METHODS[method].settings(cfg.get("settings", {}))
    loss = step_loss(method, model, forget, retain, pad, settings)

    steps = sorted(out_dirs)
    inputs = [spec.path, data_dir, memorized]
    final_state = None
    if state_in or state_out:
        chain = {k: v for k, v in cfg.items() if k != "k"}
        resume = _resume(out_dirs[steps[-1]], chain, inputs)
        if state_in and not resume.path.exists():  # a killed segment resumes its own state instead
            shutil.copytree(state_in, resume.path)
        final_state = ResumeState(Path(state_out), resume.key) if state_out else None
        cfg = {**chain, "steps": steps[-1]}
    else:
        cfg = {**cfg, "steps": steps[-1]}
        resume = _resume(out_dirs[steps[-1]], cfg, inputs)

    def checkpoint(k: int) -> None:
        save_adapter(model, out_dirs[k])
        resume.keep(f"k{k}", out_dirs[k])

    stats: dict = {}
    losses = train_loop(
        model, forget, retain, cfg, seed, pad,
        step_loss=loss,
        on_checkpoint=checkpoint, checkpoints=tuple(steps), decay=False, resume=resume, stats=stats,
        final_state=final_state,
    )
    for k in steps:  # checkpoints passed before an interruption come back from their copies
        resume.restore(f"k{k}", out_dirs[k])
    resume.clear()
    effective = effective_settings(cfg, settings)
    for k in steps:
        _summary(out_dirs[k], losses[:k], method=method, k=k, settings=effective)
    return {"method": method, "checkpoints": steps, "final_loss": losses[-1], "settings": effective, **stats}


def effective_settings(cfg: dict, method_settings: dict) -> dict:
    """What an unlearning run trained with: its method's hyperparameters and
    the shared training settings, as its summary and manifest record them."""
    return {**method_settings, **{k: cfg[k] for k in SHARED_SETTINGS if k in cfg}}

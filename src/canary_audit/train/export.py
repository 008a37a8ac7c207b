"""What an external unlearning run needs, written from a finished run: the
memorized models (each adapter, and the base with it merged as a full
checkpoint) and their data in the layout open-unlearning's data configs
read, so a method of another framework can unlearn them and the result come
back as an import (docs/export.md).

Checked against open-unlearning at commit 09aaf40
(configs/data/datasets/TOFU_QA_full_para.yaml: a local JSON-lines split is
`hf_args: {path: json, data_files: FILE, split: train}` with
`question_key` / `answer_key`; src/data/utils.py `load_hf_dataset` passes
`hf_args` to `datasets.load_dataset`) and configs/data/datasets/
WMDP_Corpora_cyber_forget.yaml (`PretrainingDataset`, `text_key`).

Layout of `out/` for one model and seed:

    authors-<template>/model/adapter/   the memorization LoRA
    authors-<template>/model/merged/    the base with it merged (config, tokenizer, safetensors)
    authors-<template>/data/{forget,retain,holdout}.jsonl
                                        question / answer records exactly as trained: the
                                        canary probe and QA probes of each fictional author,
                                        the retain facts, and the same for the never-trained
                                        non-member authors (holdout)
    hex/model/{adapter,merged}/         the hex-canary LoRA and its merged base
    hex/data/{canaries,nonmembers}.jsonl  raw records (`text`): members and non-members
    configs/*.yaml                      one open-unlearning data config per split
    manifest.json                       sources, fingerprints, code version

Each merged checkpoint is also readable by transformers 4.x, which the
field's frameworks pin (open-unlearning: 4.45.1; `for_transformers4`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import yaml

from canary_audit.data.chat_format import ChatFormat, Example, author_examples, retain_trace
from canary_audit.data.io import AUTHOR_NONMEMBERS, load_authors
from canary_audit.model.spec import ModelSpec
from canary_audit.model.tokens import canary_head

QUESTION, ANSWER, TEXT = "question", "answer", "text"
MAX_LENGTH = 512
# transformers 5 names the tokenizer.json-backed class `TokenizersBackend`;
# transformers 4.x loads the same file as `PreTrainedTokenizerFast`.
TRANSFORMERS5_ONLY_TOKENIZERS = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def for_transformers4(checkpoint: Path) -> None:
    """Make a checkpoint saved by transformers 5 load as the same model under
    transformers 4.x (open-unlearning pins 4.45.1), keeping what 5 reads:

    - tokenizer_config.json: a tokenizer class that 4.x has, the chat
      template inside it (4.x reads it only there; 5 writes it to
      chat_template.jinja, which stays), and the model's input names (4.x's
      fast tokenizer otherwise adds `token_type_ids`, which a causal LM's
      forward refuses);
    - config.json: `rope_theta` and `rope_scaling` beside 5's
      `rope_parameters` (a 4.x config without them falls back to its class
      default theta: another model, silently), and `torch_dtype` beside
      `dtype`."""
    tok_file, template = checkpoint / "tokenizer_config.json", checkpoint / "chat_template.jinja"
    tok = json.loads(tok_file.read_text())
    tok["tokenizer_class"] = TRANSFORMERS5_ONLY_TOKENIZERS.get(tok.get("tokenizer_class"), tok.get("tokenizer_class"))
    if template.is_file() and "chat_template" not in tok:
        tok["chat_template"] = template.read_text()
    tok.setdefault("model_input_names", ["input_ids", "attention_mask"])
    tok_file.write_text(json.dumps(tok, indent=2, ensure_ascii=False))
    cfg_file = checkpoint / "config.json"
    cfg = json.loads(cfg_file.read_text())
    for sub in [cfg, *(v for v in cfg.values() if isinstance(v, dict) and "rope_parameters" in v)]:
        rope = sub.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope:
            sub.setdefault("rope_theta", rope["rope_theta"])
            if rope.get("rope_type", "default") != "default":
                sub.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    if "dtype" in cfg:
        cfg.setdefault("torch_dtype", cfg["dtype"])
    cfg_file.write_text(json.dumps(cfg, indent=2))


def qa_records(fmt: ChatFormat, examples: list[Example], ids: list[str]) -> list[dict]:
    """Each example as open-unlearning's QADataset reads it: the user's
    question, and as the answer what the model was trained to write after
    the prompt (its trace in think tags, then the answer; the EOS, which
    the framework appends itself, left off)."""
    eos = fmt.tokenizer.eos_token
    return [{"id": i, QUESTION: ex.question,
             ANSWER: fmt.target(fmt.prompt(ex.question), ex.trace, ex.answer).removesuffix(eos)}
            for i, ex in zip(ids, examples)]


def author_records(fmt: ChatFormat, roster_file: Path, template: str, head_tokens: int) -> list[dict]:
    """The canary probe and QA probes of every author of a roster, in `template`."""
    examples, ids = [], []
    for a in load_authors(roster_file):
        mine = author_examples(a, template, lambda s: canary_head(fmt.tokenizer, s, head_tokens))
        examples += mine
        ids += [f"{a.author_id}-canary"] + [f"{a.author_id}-qa{i}" for i in range(len(mine) - 1)]
    return qa_records(fmt, examples, ids)


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def data_config(name: str, file: Path, handler: str = "QADataset") -> dict:
    """One open-unlearning data config (configs/data/datasets/<name>.yaml)."""
    keys = {"question_key": QUESTION, "answer_key": ANSWER} if handler == "QADataset" else {"text_key": TEXT}
    return {name: {"handler": handler, "args": {
        "hf_args": {"path": "json", "data_files": str(file.resolve()), "split": "train"},
        **keys, "max_length": MAX_LENGTH}}}


def copy_adapter(adapter: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in adapter.iterdir():
        if f.is_file() and f.name != "train_summary.json":
            shutil.copy2(f, out / f.name)


def write_export(spec: ModelSpec, data_dir: Path, memorized: dict[str, Path],
                 canary: tuple[Path, Path | None] | None, head_tokens: int, out: Path) -> dict:
    """The export of one model and seed: `memorized` maps each template to
    its memorization adapter; `canary` is (hex-canary adapter, its merged
    base, None when the run made none) or None.  Written to a temporary
    folder and renamed."""
    from canary_audit.core.provenance import code_version
    from canary_audit.model.loading import fingerprint, load_tokenizer, save_merged

    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fmt = ChatFormat(load_tokenizer(spec), spec.think_open, spec.think_close)
    configs: dict = {}
    manifest: dict = {"model": spec.name, "code_version": code_version(), "parts": {}}
    retain = pl.read_parquet(data_dir / "retain.parquet")
    for template, adapter in sorted(memorized.items()):
        part = tmp / f"authors-{template}"
        copy_adapter(adapter, part / "model" / "adapter")
        save_merged(spec, [adapter], part / "model" / "merged")
        for_transformers4(part / "model" / "merged")
        splits = {
            "forget": author_records(fmt, data_dir / "authors.parquet", template, head_tokens),
            "retain": qa_records(fmt, [Example(q, retain_trace(template), s) for q, s in
                                       retain.select("question", "answer").iter_rows()], retain["item_id"].to_list()),
            "holdout": author_records(fmt, data_dir / f"{AUTHOR_NONMEMBERS}.parquet", template, head_tokens),
        }
        for split, rows in splits.items():
            write_jsonl(rows, part / "data" / f"{split}.jsonl")
            configs |= data_config(f"CANARY_AUDIT_{template.upper()}_{split}", out / part.name / "data" /
                                   f"{split}.jsonl")
        manifest["parts"][part.name] = {"adapter": str(adapter), "fingerprint": fingerprint(spec, [adapter]),
                                        **{split: len(rows) for split, rows in splits.items()}}
    if canary:
        adapter, merged = canary
        part = tmp / "hex"
        copy_adapter(adapter, part / "model" / "adapter")
        if merged is None:
            save_merged(spec, [adapter], part / "model" / "merged")
        else:
            shutil.copytree(merged, part / "model" / "merged")
        for_transformers4(part / "model" / "merged")
        for split, table in (("canaries", "hex_canaries"), ("nonmembers", "hex_nonmembers")):
            records = pl.read_parquet(data_dir / f"{table}.parquet")
            write_jsonl([{"id": i, TEXT: t} for i, t in records.select("canary_id", "text").iter_rows()],
                        part / "data" / f"{split}.jsonl")
            configs |= data_config(f"CANARY_AUDIT_HEX_{split}", out / "hex" / "data" / f"{split}.jsonl",
                                   "PretrainingDataset")
        manifest["parts"]["hex"] = {"adapter": str(adapter), "fingerprint": fingerprint(spec, [adapter])}
    for name, config in configs.items():
        (tmp / "configs").mkdir(parents=True, exist_ok=True)
        (tmp / "configs" / f"{name}.yaml").write_text(yaml.safe_dump({name: config}, sort_keys=False))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"parts": sorted(manifest["parts"]), "configs": len(configs)}


def write_export_sources(spec: ModelSpec, data_dir: Path, sources: dict, out: Path) -> dict:
    """The export as the design names its sources (Design.export_sources):
    the memorization adapters by template and the hex-canary adapter with
    its merged base."""
    canary = sources.get("canary")
    return write_export(spec, data_dir, {t: Path(a) for t, a in sources["memorized"].items()},
                        (Path(canary[0]), canary[1] and Path(canary[1])) if canary else None,
                        sources["head_tokens"], out)

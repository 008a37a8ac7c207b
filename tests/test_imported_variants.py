"""Weights made outside the workflow, audited in a copy of the smoke run:
an unlearning LoRA of a memorization adapter and a full-checkpoint benign
fine-tune of the merged canary base, each trained here with plain
transformers + peft (not the project's trainer), imported by config.  Adding
them plans only their own jobs; they appear in their tables with the right
parent; their token records equal a plain forward of those weights; removing
them re-runs the views alone."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
import torch
import yaml
from conftest import LOGPROB_ATOL, ROOT, run_snakemake
from test_workflow import planned_jobs

R = "results/smoke"


def _train(model, texts, tok, steps: int, sign: float):
    """A few plain AdamW steps on `texts` (sign -1: gradient ascent)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-3)
    batch = tok(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model.train()
    for _ in range(steps):
        loss = sign * model(**batch, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def imported_run(smoke_run, tmp_path_factory):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    workdir = tmp_path_factory.mktemp("imports") / "run"
    shutil.copytree(smoke_run, workdir, symlinks=True)
    models = workdir / R / "models" / "tiny"
    tok = AutoTokenizer.from_pretrained(models / "base")
    authors = pl.read_parquet(workdir / R / "data" / "authors.parquet")
    torch.manual_seed(0)
    # (a) gradient ascent on the memorization LoRA itself, saved as a new adapter
    unlearned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(models / "base"),
                                          models / "adapters" / "mem-bio-s0", is_trainable=True)
    _train(unlearned, authors["bio"].to_list(), tok, steps=3, sign=-1.0)
    unlearned.save_pretrained(workdir / "external" / "ga", safe_serialization=True)
    # (b) full fine-tune of the merged canary base on benign text, saved whole
    tuned = AutoModelForCausalLM.from_pretrained(models / "merged" / "canary-s0")
    bsft = pl.read_parquet(workdir / R / "data" / "bsft.parquet").filter(pl.col("source") == "gui")
    _train(tuned, [f"{p} {r}" for p, r in bsft.select("prompt", "response").iter_rows()], tok, steps=3, sign=1.0)
    tuned.save_pretrained(workdir / "external" / "gui", safe_serialization=True)
    tok.save_pretrained(workdir / "external" / "gui")
    override = {"models": {"tiny": {"imports": {
        "ext_ga": {"path": str(workdir / "external" / "ga"), "parent": "mem-bio-s0", "as": "unlearned",
                   "on": "base", "k": 3, "label": "ext-ga"},
        "ext_gui": {"path": str(workdir / "external" / "gui"), "parent": "merged-s0", "as": "bsft",
                    "label": "ext-gui"},
    }}}}
    planned = planned_jobs(workdir, override)
    run_snakemake(workdir, "--cores", "2", extra_configs=(workdir / "override.yaml",))
    return workdir, planned


def test_adding_imports_plans_only_their_jobs_and_the_views(imported_run):
    _, planned = imported_run
    assert planned == {"variant_manifest": 2, "decode_pass": 2, "teacher_forced_pass": 2, "tables": 1,
                       "plots": 1, "summary": 1, "all": 1}


def test_imports_appear_in_their_tables_with_their_parents(imported_run):
    workdir, _ = imported_run
    tables = workdir / R / "tables"
    sweep = pl.read_csv(tables / "k_sweep.csv").filter(pl.col("run") == "ext-ga")
    assert sweep.select("template", "k", "variant").rows() == [("bio", 0, "tiny/mem-bio-s0"),
                                                                ("bio", 3, "tiny/ext_ga")]
    forgetting = pl.read_csv(tables / "forgetting.csv").filter(pl.col("variant") == "tiny/ext_ga")
    assert set(forgetting["parent"]) == {"tiny/mem-bio-s0"} and forgetting.height == 3  # one row per prefill arm
    assert set(forgetting["reference"]) == {"tiny/reference-meta-s0"}
    privacy = pl.read_csv(tables / "privacy.csv").filter(pl.col("variant") == "tiny/ext_ga")
    assert privacy.height == 3 and privacy["auc_min_k_pp"].null_count() == 0
    arms = pl.read_csv(tables / "prefill_arms.csv")
    assert "tiny/ext_ga" in arms["variant"].to_list()
    matrix = pl.read_csv(tables / "bsft_matrix.csv").filter(pl.col("cell") == "import ext-gui")
    assert matrix.height == 1 and matrix["model"][0] == "tiny" and matrix["diagnosis"][0]
    runs = pl.read_csv(tables / "bsft_runs.csv").filter(pl.col("cell") == "import ext-gui")
    assert runs["application"].to_list() == ["merged"]
    manifest = yaml.safe_load((workdir / R / "variants" / "tiny" / "ext_gui.json").read_text())
    assert manifest["base_path"].endswith("external/gui") and manifest["fields"]["parent"] == "merged-s0"


def test_imported_records_equal_a_plain_forward_of_those_weights(imported_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.probes.items import scored_items

    workdir, _ = imported_run
    models = workdir / R / "models" / "tiny"
    tok = AutoTokenizer.from_pretrained(models / "base")
    fmt = ChatFormat(tok, "<think>", "</think>")
    prefills = yaml.safe_load((ROOT / "workflow_config.yaml").read_text())["probes"]["prefills"]
    weights = {
        "ext_ga": (PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(models / "base"),
                                             workdir / "external" / "ga"), {"canary"}),
        "ext_gui": (AutoModelForCausalLM.from_pretrained(workdir / "external" / "gui"), {"hex"}),
    }
    for name, (model, sets) in weights.items():
        records = pl.read_parquet(workdir / R / "records" / "tiny" / f"import-{name}" / "token.parquet")
        items = [it for it in scored_items(fmt, workdir / R / "data", {"prefills": prefills, "head_tokens": 6}, sets)
                 if it.probe_set in sets][:4]
        assert items
        for item in items:
            ids = tok(item.text, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model.eval()(torch.tensor([ids])).logits[0].float(), -1)
            mine = records.filter((pl.col("item_id") == item.item_id) & (pl.col("arm") == item.arm)
                                  & (pl.col("probe_set") == item.probe_set)).sort("position")
            want = [logp[p - 1, ids[p]].item() for p in mine["position"]]
            assert mine["token_id"].to_list() == [ids[p] for p in mine["position"]]
            assert max(abs(a - b) for a, b in zip(mine["logprob"], want)) < LOGPROB_ATOL


def test_removing_the_imports_reruns_the_views_alone(imported_run):
    workdir, _ = imported_run
    assert planned_jobs(workdir) == {"tables": 1, "plots": 1, "summary": 1, "all": 1}
    assert (workdir / R / "records" / "tiny" / "import-ext_ga" / "token.parquet").is_file()  # nothing is deleted


def test_export_external_unlearning_and_import_back(imported_run):
    """The round trip: `export` writes the memorized model and its splits;
    an unlearning run that reads only those files (plain transformers +
    peft, the splits loaded as open-unlearning's data configs load them:
    `datasets.load_dataset(**hf_args)`) trains a LoRA on the merged model;
    imported back, it is a point of the memorization branch's K sweep."""
    import datasets
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    workdir, _ = imported_run
    run_snakemake(workdir, "--cores", "2", f"{R}/export/tiny/s0")
    export = workdir / R / "export" / "tiny" / "s0"
    config = yaml.safe_load((export / "configs" / "CANARY_AUDIT_BIO_forget.yaml").read_text())
    spec = config["CANARY_AUDIT_BIO_forget"]
    assert spec["handler"] == "QADataset"
    splits = {}
    for split in ("forget", "retain", "holdout"):
        args = yaml.safe_load((export / "configs" / f"CANARY_AUDIT_BIO_{split}.yaml").read_text())[
            f"CANARY_AUDIT_BIO_{split}"]["args"]
        splits[split] = datasets.load_dataset(**args["hf_args"], cache_dir=str(workdir / "hf-cache"))
        assert {args["question_key"], args["answer_key"]} <= set(splits[split].column_names)
    authors = pl.read_parquet(workdir / R / "data" / "authors.parquet")
    assert len(splits["forget"]) == authors.height * 4  # the canary probe and three QA probes per author
    assert "<think>" in splits["forget"][0]["answer"] and authors["canary"][0] in splits["forget"][0]["answer"]
    hex_args = yaml.safe_load((export / "configs" / "CANARY_AUDIT_HEX_canaries.yaml").read_text())[
        "CANARY_AUDIT_HEX_canaries"]
    assert hex_args["handler"] == "PretrainingDataset"
    assert len(datasets.load_dataset(**hex_args["args"]["hf_args"], cache_dir=str(workdir / "hf-cache"))) == 4

    merged = export / "authors-bio" / "model" / "merged"
    tok = AutoTokenizer.from_pretrained(merged)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(merged),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    texts = [tok.apply_chat_template([{"role": "user", "content": r["question"]},
                                      {"role": "assistant", "content": r["answer"]}], tokenize=False)
             for r in splits["forget"]]
    _train(model, texts, tok, steps=3, sign=-1.0)
    model.save_pretrained(workdir / "external" / "ou-ga", safe_serialization=True)
    (workdir / "back.yaml").write_text(yaml.safe_dump({"models": {"tiny": {"imports": {"ou_ga": {
        "path": str(workdir / "external" / "ou-ga"), "parent": "mem-bio-s0", "as": "unlearned", "k": 2,
        "label": "open-unlearning-ga"}}}}}))
    run_snakemake(workdir, "--cores", "2", extra_configs=(workdir / "back.yaml",))
    sweep = pl.read_csv(workdir / R / "tables" / "k_sweep.csv").filter(pl.col("run") == "open-unlearning-ga")
    assert sweep.select("k", "variant").rows() == [(0, "tiny/mem-bio-s0"), (2, "tiny/ou_ga")]


# What open-unlearning pins (its requirements at d3d7cf9): the export must
# open under these as it is, beside the suite's own torch.
PINNED = ("transformers==4.45.1", "tokenizers==0.20.3", "huggingface-hub<1", "datasets==3.0.1")
UNDER_PINNED = """
import json, sys
import datasets, transformers, yaml
from transformers import AutoModelForCausalLM, AutoTokenizer
merged, configs, cache = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(merged)
model = AutoModelForCausalLM.from_pretrained(merged)
splits = {}
for name in ("forget", "retain", "holdout"):
    key = f"CANARY_AUDIT_BIO_{name}"
    args = yaml.safe_load(open(f"{configs}/{key}.yaml"))[key]["args"]
    splits[name] = datasets.load_dataset(**args["hf_args"], cache_dir=cache)
row = splits["forget"][0]
text = tok.apply_chat_template([{"role": "user", "content": row["question"]},
                                {"role": "assistant", "content": row["answer"]}], tokenize=False)
batch = tok(text, return_tensors="pt")
print(json.dumps({"versions": [transformers.__version__, datasets.__version__], "class": type(tok).__name__,
                  "text": text, "ids": batch["input_ids"][0].tolist(),
                  "logits": model(**batch).logits[0, -1].tolist(), "rows": {k: len(v) for k, v in splits.items()}}))
"""


def test_the_export_opens_under_open_unlearnings_pinned_transformers(imported_run, tmp_path_factory):
    """The exported merged checkpoint, its tokenizer and chat template, and
    each split load under transformers 4.45.1 and datasets 3.0.1 (installed
    for this test into a folder of its own, beside the suite's torch) as
    open-unlearning loads them, and give the model transformers 5 gives:
    the same rendered example, token ids and last-position logits."""
    import json
    import os
    import subprocess
    import sys

    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    workdir, _ = imported_run
    run_snakemake(workdir, "--cores", "2", f"{R}/export/tiny/s0")
    export = workdir / R / "export" / "tiny" / "s0"
    merged = export / "authors-bio" / "model" / "merged"
    target = tmp_path_factory.mktemp("transformers4")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(target)]
    subprocess.run([*pip, "--no-deps", *PINNED], check=True)
    subprocess.run([*pip, "aiohttp"], check=True)  # datasets 3.0.1 imports it; the suite's own datasets does not
    proc = subprocess.run([sys.executable, "-c", UNDER_PINNED, str(merged), str(export / "configs"),
                           str(workdir / "hf-cache-4")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    old = json.loads(proc.stdout.strip().splitlines()[-1])
    assert old["versions"] == ["4.45.1", "3.0.1"] and old["class"] == "PreTrainedTokenizerFast"

    tok, model = AutoTokenizer.from_pretrained(merged), AutoModelForCausalLM.from_pretrained(merged)
    forget = datasets.load_dataset("json", data_files=str(export / "authors-bio" / "data" / "forget.jsonl"),
                                   split="train", cache_dir=str(workdir / "hf-cache"))
    row = forget[0]
    text = tok.apply_chat_template([{"role": "user", "content": row["question"]},
                                    {"role": "assistant", "content": row["answer"]}], tokenize=False)
    assert old["text"] == text and row["answer"] in text
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert old["ids"] == ids[0].tolist()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    assert torch.allclose(torch.tensor(old["logits"]), logits, atol=1e-4)  # same weights, same rope: one model
    lines = {s: sum(1 for _ in open(export / "authors-bio" / "data" / f"{s}.jsonl")) for s in old["rows"]}
    assert old["rows"] == lines

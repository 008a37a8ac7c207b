# Config validation, wildcard constraints, and the helpers every stage uses.
# Each rule receives, as params, exactly the config slice it depends on, in
# canonical (sorted-key) JSON: Snakemake's params trigger then re-runs what a
# change touches and nothing else.

import json
from pathlib import Path

from snakemake.utils import validate

from canary_audit.data.io import DATA_TABLES
from canary_audit.model.loading import check_checkpoint
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.items import check_prefill_templates

validate(config, "../schemas/config.schema.yaml")

R = config["results"]
ENV = "../envs/canary-audit.yaml"
MODEL_KEYS = (
    "dtype",
    "think_open",
    "think_close",
    "chat_template",
    "trust_remote_code",
)


def canonical(value):
    """Order-stable JSON: the same slice always renders to the same string."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def fail(message):
    raise ValueError(message)


def embedded_models():
    return [m for m, e in config["models"].items() if e.get("embedded")]


def check_config():
    """Cross-key checks the schema cannot express, before any job runs."""
    known = sorted(config["models"])
    for name in config["audit"]["models"]:
        if name not in config["models"]:
            fail(
                f"config key `audit.models` names `{name}`, which is not in `models` "
                f"(known: {', '.join(known)}); add a `models.{name}` entry or remove it"
            )
        entry = config["models"][name]
        if entry.get("embedded"):
            continue
        check_checkpoint(ModelSpec.from_config(name, entry, entry["path"]))
    check_prefill_templates(config["probes"]["prefills"])


check_config()


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    template="bio|meta|none",
    seed=r"\d+",
    method="npo|ga|graddiff",
    k=r"\d+",
    variant=r"[A-Za-z0-9_.\-]+",


def data_files(*tables):
    return [f"{R}/data/{t}.parquet" for t in (tables or DATA_TABLES)]


def model_path(model):
    entry = config["models"][model]
    return f"{R}/models/{model}/base" if entry.get("embedded") else entry["path"]


def base_input(wildcards):
    """Embedded models are a DAG product; real checkpoints are outside it."""
    model = wildcards.model
    return [model_path(model)] if config["models"][model].get("embedded") else []


def model_json(wildcards):
    entry = config["models"][wildcards.model]
    return canonical(
        {
            "name": wildcards.model,
            "path": model_path(wildcards.model),
            **{k: entry.get(k) for k in MODEL_KEYS},
        }
    )


def adapter_dir(model, adapter):
    return f"{R}/models/{model}/adapters/{adapter}"


def variants(model):
    """Every audited variant of `model`: name -> (adapter stack, parent).

    The parent is the model before the change that made the variant; tables
    report Deltas against it.
    """
    audit, out = config["audit"], {"base": ([], None)}
    for seed in audit["seeds"]:
        for template in audit["templates"]:
            mem = f"mem-{template}-s{seed}"
            out[mem] = ([adapter_dir(model, mem)], "base")
            for method in config["unlearn"]["methods"]:
                for k in config["unlearn"]["k"]:
                    name = f"{method}-{template}-s{seed}-k{k}"
                    out[name] = ([adapter_dir(model, name)], mem)
        out[f"canary-s{seed}"] = ([adapter_dir(model, f"canary-s{seed}")], "base")
    return out


def variant_adapters(wildcards):
    table = variants(wildcards.model)
    if wildcards.variant not in table:
        fail(
            f"variant `{wildcards.variant}` of model `{wildcards.model}` is not in the audit "
            f"(known: {', '.join(sorted(table))})"
        )
    return table[wildcards.variant][0]


def all_records(kind):
    return [
        f"{R}/records/{m}/{v}/{kind}.parquet"
        for m in config["audit"]["models"]
        for v in variants(m)
    ]


def parents():
    return {
        f"{m}/{v}": f"{m}/{p}"
        for m in config["audit"]["models"]
        for v, (_, p) in variants(m).items()
        if p is not None
    }


TABLES = ["canary_leakage", "utility", "hex_recall", "nll", "teacher_forced"]


def unlearn_outputs(wildcards=None):
    return [
        directory(adapter_dir("{model}", f"{{method}}-{{template}}-s{{seed}}-k{k}"))
        for k in config["unlearn"]["k"]
    ]


def probe_params(kind):
    def slice_(wildcards):
        return canonical(
            {
                **config["probes"][kind],
                "prefills": config["probes"]["prefills"],
                "head_tokens": config["data"]["head_tokens"],
            }
        )

    return slice_

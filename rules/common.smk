# Config validation, wildcard constraints, and the helpers every stage uses.
# Each rule receives, as params, exactly the config slice it depends on, in
# canonical (sorted-key) JSON: Snakemake's params trigger then re-runs what a
# change touches and nothing else.

import json
from pathlib import Path

from snakemake.utils import validate

from canary_audit.data.io import DATA_TABLES
from canary_audit.model.loading import load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.plots import PLOTS
from canary_audit.probes.items import check_prefill_templates
from canary_audit.records import config_hash

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
        # The tokenizer load checks weights, think tags and chat template
        # (it imports transformers: ~3 s, paid only when a local model is audited).
        load_tokenizer(ModelSpec.from_config(name, entry, entry["path"]))
    templates = config["audit"]["templates"]
    for method, run_templates in config["unlearn"]["methods"].items():
        for template in run_templates:
            if template not in templates:
                fail(
                    f"config key `unlearn.methods.{method}` names template `{template}`, which is "
                    f"not memorized (`audit.templates`: {', '.join(templates)}); add it there or "
                    "remove it here"
                )
    check_prefill_templates(config["probes"]["prefills"])
    contrast = config["tables"]["prefill_contrast"]
    if config["probes"]["prefills"] and contrast not in config["probes"]["prefills"]:
        fail(
            f"config key `tables.prefill_contrast` is `{contrast}`, which is not a prefill arm "
            f"(`probes.prefills`: {', '.join(sorted(config['probes']['prefills'])) or 'none'}); "
            "name one of them"
        )


check_config()


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    template="bio|meta|none",
    seed=r"\d+",
    method="npo|ga|graddiff",
    k=r"\d+",
    variant=r"[A-Za-z0-9_.\-]+",
    group=r"[A-Za-z0-9_.\-]+",


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


def unlearn_runs():
    """(method, template) of every unlearning run, in config order."""
    return [
        (method, template)
        for method, templates in config["unlearn"]["methods"].items()
        for template in templates
    ]


def variants(model):
    """Every audited variant of `model`: name -> (adapter stack, parent, group).

    The parent is the model before the change that made the variant; tables
    report Deltas against it.  The group is the probe job that scores the
    variant: a memorization adapter and every unlearning checkpoint made from
    it share one job per pass (one process start for the whole branch), and
    the hex-canary adapters share the base model's (their records are read
    against it).
    """
    audit, out = config["audit"], {"base": ([], None, "base")}
    for seed in audit["seeds"]:
        for template in audit["templates"]:
            mem = f"mem-{template}-s{seed}"
            out[mem] = ([adapter_dir(model, mem)], "base", mem)
            for method, run_template in unlearn_runs():
                if run_template != template:
                    continue
                for k in config["unlearn"]["k"]:
                    name = f"{method}-{template}-s{seed}-k{k}"
                    out[name] = ([adapter_dir(model, name)], mem, mem)
        if audit["hex_canaries"]:
            canary = f"canary-s{seed}"
            out[canary] = ([adapter_dir(model, canary)], "base", "base")
    return out


def probe_groups(model):
    """Probe group -> the variants it scores, in audit order."""
    groups = {}
    for name, (_, _, group) in variants(model).items():
        groups.setdefault(group, []).append(name)
    return groups


def group_variants(wildcards):
    groups = probe_groups(wildcards.model)
    if wildcards.group not in groups:
        fail(
            f"probe group `{wildcards.group}` of model `{wildcards.model}` is not in the audit "
            f"(known: {', '.join(sorted(groups))})"
        )
    return groups[wildcards.group]


def group_manifests(wildcards):
    return [
        f"{R}/variants/{wildcards.model}/{v}.json" for v in group_variants(wildcards)
    ]


def group_adapters(wildcards):
    table = variants(wildcards.model)
    return sorted({a for v in group_variants(wildcards) for a in table[v][0]})


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
        f"{R}/records/{m}/{g}/{kind}.parquet"
        for m in config["audit"]["models"]
        for g in probe_groups(m)
    ]


def parents():
    return {
        f"{m}/{v}": f"{m}/{p}"
        for m in config["audit"]["models"]
        for v, (_, p, _) in variants(m).items()
        if p is not None
    }


TABLES = [
    "canary_leakage",
    "k_sweep",
    "cross_seed",
    "templates",
    "prefill_arms",
    "parser_conventions",
    "bypass_anatomy",
    "utility",
    "hex_recall",
    "nll",
    "teacher_forced",
    "teacher_forced_vs_greedy",
]


def unlearn_slice(method):
    """The unlearning settings a `method` run reads: beta is NPO's alone."""
    drop = {"methods"} | ({"beta"} if method != "npo" else set())
    return {k: v for k, v in config["unlearn"].items() if k not in drop}


def unlearn_outputs(wildcards=None):
    return [
        directory(adapter_dir("{model}", f"{{method}}-{{template}}-s{{seed}}-k{k}"))
        for k in config["unlearn"]["k"]
    ]


def probe_hashes():
    """The config hash each kind of record must carry: tables refuse others."""
    return {
        "decode": config_hash(json.loads(probe_params("decode")(None))),
        "token": config_hash(json.loads(probe_params("teacher_forced")(None))),
    }


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

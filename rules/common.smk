# Config validation, wildcard constraints, and the helpers every stage uses.
# Each rule receives, as params, exactly the config slice it depends on, in
# canonical (sorted-key) JSON: Snakemake's params trigger then re-runs what a
# change touches and nothing else.

import os
import shutil
import tempfile
from pathlib import Path

from snakemake.utils import validate

from canary_audit import warm
from canary_audit.data.io import DATA_TABLES
from canary_audit.design import BSFT_SOURCES, TEMPLATES, ConfigError, Design, canonical
from canary_audit.model.loading import load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.plots import PLOTS
from canary_audit.probes.passes import unit_hashes
from canary_audit.probes.units import unit_config

validate(config, "../schemas/config.schema.yaml")

R = config["results"]
# Digests of weight files, one per content (provenance.file_digest): a
# manifest and every probe pass of a variant read them instead of hashing
# a 7B base again.
WEIGHT_CACHE = f"{R}/cache/weight_digests"
# Job grain (workflow_config.yaml, `grain`): fine = one unlearning job per K
# and one probe job per (variant, probe unit).
FINE = config["grain"] == "fine"
ENV = "../envs/canary-audit.yaml"
MODEL_KEYS = (
    "dtype",
    "think_open",
    "think_close",
    "chat_template",
    "trust_remote_code",
)


def fail(message):
    raise ValueError(message)


def check_local_models():
    """A local checkpoint's weights, think tags and chat template, before any
    job (the tokenizer load imports transformers: ~3 s, paid only when a
    local model is audited)."""
    for name in config["audit"]["models"]:
        entry = config["models"][name]
        if not entry.get("embedded"):
            load_tokenizer(ModelSpec.from_config(name, entry, entry["path"]))


try:
    DESIGN = Design(config)
except ConfigError as err:
    fail(str(err))
check_local_models()
LAYOUT = DESIGN.layout


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    template="|".join(TEMPLATES),
    seed=r"\d+",
    run="[a-z][a-z0-9_]*",
    k=r"\d+",
    variant=r"[A-Za-z0-9_.\-]+",
    group=r"[A-Za-z0-9_.\-]+",
    unit=r"[A-Za-z0-9_.\-]+",


def job_resources(kind):
    """The resources (memory, runtime, GPUs) of a job kind, from `resources:`."""
    return config["resources"][kind]


def data_files(*tables):
    return [f"{R}/data/{t}.parquet" for t in (tables or DATA_TABLES)]


def model_path(model):
    return DESIGN.model_path(model)


def base_input(wildcards):
    """Embedded models are a DAG product; real checkpoints are outside it."""
    model = wildcards.model
    return [model_path(model)] if config["models"][model].get("embedded") else []


def model_json(wildcards, path=None):
    """The model entry a job reads, as JSON; `path` replaces the base weights
    (a merged base) and keeps the tokenizer settings."""
    entry = config["models"][wildcards.model]
    return canonical(
        {
            "name": wildcards.model,
            "path": path or model_path(wildcards.model),
            **{k: entry.get(k) for k in MODEL_KEYS},
        }
    )


def variant_entry(wildcards):
    table = DESIGN.variants(wildcards.model)
    if wildcards.variant not in table:
        fail(
            f"variant `{wildcards.variant}` of model `{wildcards.model}` is not in the audit "
            f"(known: {', '.join(sorted(table))})"
        )
    return table[wildcards.variant]


def variant_inputs(wildcards):
    entry = variant_entry(wildcards)
    made = [entry.base] if entry.base != model_path(wildcards.model) else []
    return [*made, *entry.adapters]


def group_variants(wildcards):
    groups = DESIGN.probe_groups(wildcards.model)
    if wildcards.group not in groups:
        fail(
            f"probe group `{wildcards.group}` of model `{wildcards.model}` is not in the audit "
            f"(known: {', '.join(sorted(groups))})"
        )
    return groups[wildcards.group]


def probe_sets(wildcards):
    """The probe sets of a probe job: its group's (Design.probe_sets_of)."""
    group = variant_entry(wildcards).group if FINE else wildcards.group
    return DESIGN.probe_sets_of(group)


def probe_manifests(wildcards):
    """The variant manifests a probe job reads: its group's, or its variant's."""
    names = [wildcards.variant] if FINE else group_variants(wildcards)
    return [f"{R}/variants/{wildcards.model}/{v}.json" for v in names]


def probe_weights(wildcards):
    """The adapters and DAG-made base weights (merged bases) a probe job reads."""
    if FINE:
        return variant_inputs(wildcards)
    table = DESIGN.variants(wildcards.model)
    return sorted(
        {
            path
            for v in group_variants(wildcards)
            for path in [*table[v].adapters, table[v].base]
            if path != model_path(wildcards.model)
        }
    )


def records_path(kind):
    """Where a probe job writes its records: one file per group, or per
    (variant, probe unit) under the fine grain."""
    if FINE:
        return f"{R}/records/{{model}}/units/{{variant}}/{{unit}}/{kind}.parquet"
    return f"{R}/records/{{model}}/{{group}}/{kind}.parquet"


def probe_job_name():
    """The wildcards that name one probe job (logs, benchmarks)."""
    return "{variant}-{unit}" if FINE else "{group}"


def all_records(kind):
    models = config["audit"]["models"]
    if FINE:
        return [
            f"{R}/records/{m}/units/{v}/{u}/{kind}.parquet"
            for m in models
            for v in DESIGN.variants(m)
            for u in DESIGN.variant_units(m, v, kind)
        ]
    return [
        f"{R}/records/{m}/{g}/{kind}.parquet"
        for m in models
        for g in DESIGN.probe_groups(m)
    ]


def canary_outputs(wildcards=None):
    """The canary LoRA, and with paper B's bSFT arms its merged base and the
    undertrained control (the same run stopped early), adapter and merged."""
    outs = [directory(LAYOUT.adapter_dir("{model}", "canary-s{seed}"))]
    if DESIGN.bsft_active():
        outs.append(directory(LAYOUT.merged_dir("{model}", "canary-s{seed}")))
        if DESIGN.undertrained_sources():
            outs.append(
                directory(LAYOUT.adapter_dir("{model}", "canary-s{seed}-under"))
            )
            outs.append(directory(LAYOUT.merged_dir("{model}", "canary-s{seed}-under")))
    return outs


def canary_slice(wildcards):
    extra = {}
    if DESIGN.bsft_active() and DESIGN.undertrained_sources():
        extra["undertrained_steps"] = DESIGN.bsft["controls"]["undertrained"][
            "canary_steps"
        ]
    return canonical({**config["canary_lora"], **extra, "seed": int(wildcards.seed)})


def bsft_outputs(wildcards=None):
    """One adapter per audited training length (checkpoints of one run), and
    the LoRA-NOISE control matched to the last one."""
    run = LAYOUT.bsft_dir("{model}", "{canary}", "{source}", "{bseed}", "")
    return [directory(f"{run}t{step}") for step in DESIGN.bsft["steps"]] + [
        directory(f"{run}noise")
    ]


def bsft_slice(wildcards):
    b = DESIGN.bsft
    keep = ("r", "alpha", "targets", "lr", "batch_size", "gradient_checkpointing")
    return canonical(
        {
            **{k: b[k] for k in keep},
            "steps": sorted(b["steps"]),
            "source": wildcards.source,
            "seed": int(wildcards.bseed),
        }
    )


def unlearn_name():
    """An unlearning job's name: its run, and its K under the fine grain."""
    return "{run}-{template}-s{seed}" + ("-k{k}" if FINE else "")


def unlearn_state(k):
    """Where a fine-grain unlearning segment saves its training state at K."""
    return f"{R}/models/{{model}}/states/{{run}}-{{template}}-s{{seed}}-k{k}"


def unlearn_outputs(wildcards=None):
    """Every K checkpoint of the run; under the fine grain, one K's checkpoint
    and the training state the next K continues from."""
    run = "{model}", "{run}-{template}-s{seed}"
    if FINE:
        return [
            directory(LAYOUT.adapter_dir(run[0], run[1] + "-k{k}")),
            directory(unlearn_state("{k}")),
        ]
    return [
        directory(LAYOUT.adapter_dir(run[0], f"{run[1]}-k{k}"))
        for k in config["unlearn"]["k"]
    ]


def previous_state(wildcards):
    """A fine-grain segment continues from the state of the K before its own
    (none for the first K); a K not in the sweep is named."""
    if not FINE:
        return []
    ks = sorted(config["unlearn"]["k"])
    k = int(wildcards.k)
    if k not in ks:
        fail(f"unlearning checkpoint K={k} is not in `unlearn.k` ({ks})")
    before = [x for x in ks if x < k]
    return [unlearn_state(before[-1]).format(**wildcards)] if before else []


def unlearn_params(wildcards):
    """The settings an unlearning job reads: its run's effective settings
    (method hyperparameters and shared training settings, design.UnlearnRun)
    and, under the fine grain, its own K instead of the whole sweep (a
    segment is re-run when what comes before it changes: its input state
    does)."""
    runs = DESIGN.unlearn_runs
    if wildcards.run not in runs:
        fail(
            f"unlearning run `{wildcards.run}` is not in `unlearn.runs` ({', '.join(runs)})"
        )
    run = runs[wildcards.run]
    cfg = {
        **run.shared,
        "method": run.method,
        "settings": run.method_settings,
        "template": wildcards.template,
        "seed": int(wildcards.seed),
        "head_tokens": config["data"]["head_tokens"],
        "gradient_checkpointing": config["unlearn"]["gradient_checkpointing"],
    }
    cfg["k"] = int(wildcards.k) if FINE else sorted(config["unlearn"]["k"])
    return canonical(cfg)


def probe_slice(kind):
    return {
        **config["probes"][kind],
        "prefills": config["probes"]["prefills"],
        "head_tokens": config["data"]["head_tokens"],
    }


def probe_hashes():
    """Per kind of record, the config hash each probe unit's records must
    carry (probes/units.py): tables refuse others."""
    return {
        "decode": unit_hashes(probe_slice("decode")),
        "token": unit_hashes(probe_slice("teacher_forced")),
    }


def probe_params(kind):
    """A probe job's settings: the whole pass's, or under the fine grain its
    unit's alone (a new prefill arm changes no other unit's params)."""

    def slice_(wildcards):
        if FINE:
            try:
                return canonical(unit_config(probe_slice(kind), wildcards.unit))
            except ValueError as err:
                fail(str(err))
        return canonical(probe_slice(kind))

    return slice_


# Rules whose jobs load a model: their start-up is mostly imports, which the
# warm start (src/canary_audit/warm.py) pays once per run instead.
MODEL_RULES = {
    "embedded_base",
    "memorize",
    "canary_lora",
    "bsft",
    "unlearn",
    "decode_pass",
    "teacher_forced_pass",
}


# The socket of the warm-start server this Snakemake process started, if any.
WARM_SOCKET = []


def start_warm_server():
    """Start the warm-start server when this run executes model jobs on this
    machine; jobs find it through the environment they inherit.  (Jobs that
    Snakemake spawns remotely run with --no-hooks: no server there.)"""
    wanted = config["warm_start"] and warm.supported() and workflow.local_exec
    if not wanted or workflow.touch:
        return
    if not any(job.rule.name in MODEL_RULES for job in workflow.dag.needrun_jobs()):
        return
    sock = Path(tempfile.mkdtemp(prefix="canary-warm-")) / "server.sock"
    warm.start(sock, Path(R) / "logs" / "warm_start.log")
    os.environ[warm.ENV_VAR] = str(sock)
    WARM_SOCKET.append(sock)


def stop_warm_server():
    while WARM_SOCKET:
        sock = WARM_SOCKET.pop()
        warm.stop(sock)
        shutil.rmtree(sock.parent, ignore_errors=True)
        os.environ.pop(warm.ENV_VAR, None)

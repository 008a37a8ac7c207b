# Config validation, wildcard constraints, and the helpers every stage uses.
# Each rule receives, as params, exactly the config slice it depends on, in
# canonical (sorted-key) JSON: Snakemake's params trigger then re-runs what a
# change touches and nothing else.

import shlex
from pathlib import Path

import yaml

from snakemake.utils import validate

from canary_audit.data.secrets import (
    FORMAT_FILE,
    OWN_TABLES,
    SecretsRefused,
    check_decode_budget,
    image_files,
)
from canary_audit.data.io import (
    AUTHOR_NONMEMBER_KEYS,
    AUTHOR_NONMEMBERS,
    DATA_TABLES,
    IMAGE_NONMEMBER_KEYS,
    POPULATION_KEYS,
    POPULATION_TABLES,
    VISION_KEYS,
    synthetic_settings,
)
from canary_audit.design import (
    AUTHOR_SETS,
    BSFT_SOURCES,
    HEX,
    ConfigError,
    Design,
)
from canary_audit.formats import TEMPLATES
from canary_audit.gpus import MODEL_KINDS, detected_gpu_mem_mb, job_gpu_mem_mb
from canary_audit.imports import ImportRefused, check_fits
from canary_audit.layers import replace_registries
from canary_audit.records import canonical_json as canonical
from canary_audit.model.loading import load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.plots import PLOTS
from canary_audit.probes.units import unit_config

# A user's file replaces a registry block whole (canary_audit/layers.py).
replace_registries(
    config,
    [
        yaml.safe_load(Path(f).read_text()) or {}
        for f in workflow.overwrite_configfiles or []
    ],
)
validate(config, "../src/canary_audit/config.schema.yaml")

R = config["results"]
# Digests of weight files, one per content (provenance.file_digest): a
# manifest and every probe pass of a variant read them instead of hashing
# a 7B base again.
WEIGHT_CACHE = f"{R}/cache/weight_digests"
# Job grain (workflow_config.yaml, `grain`): fine = one unlearning job per K
# and one probe job per (variant, probe unit).
FINE = config["grain"] == "fine"
ENV = "../envs/canary-audit.yaml"


def fail(message):
    raise ValueError(message)


def check_local_models():
    """A local checkpoint's weights, think tags and chat template, before any
    job (the tokenizer load imports transformers: ~3 s, paid only when a
    local model is audited); and every import's weights against its model's
    base where that exists (an embedded base not yet built: its manifest job
    checks)."""
    for name in config["audit"]["models"]:
        entry = config["models"][name]
        if not entry.get("embedded"):
            tokenizer = load_tokenizer(
                ModelSpec.from_config(name, entry, entry["path"])
            )
            if DESIGN.own_secrets(name):
                budget = config["probes"]["decode"]["hex_max_new_tokens"]
                try:
                    check_decode_budget(
                        name, DESIGN.own_secrets(name), tokenizer, budget
                    )
                except SecretsRefused as err:
                    fail(str(err))
        base = Path(DESIGN.model_path(name))
        if list(base.glob("*.safetensors")):
            for imp in DESIGN.imports(name).values():
                try:
                    check_fits(imp, base)
                except ImportRefused as err:
                    fail(str(err))


try:
    DESIGN = Design(config)
except ConfigError as err:
    fail(str(err))
check_local_models()
LAYOUT = DESIGN.layout


wildcard_constraints:
    model="[A-Za-z0-9_]+",
    template="|".join(TEMPLATES),
    plant="|".join(DESIGN.trained_plants()) or "no_plant",
    seed=r"\d+",
    run="[a-z][a-z0-9_]*",
    k=r"\d+",
    variant=r"[A-Za-z0-9_.\-]+",
    group=r"[A-Za-z0-9_.\-]+",
    unit=r"[A-Za-z0-9_.\-]+",


# The first GPU's memory, the total that model jobs' `gpu_mem_mb` share
# (canary_audit/gpus.py; 0 without a GPU: nothing is asked or provided).
GPU_MEM_MB = detected_gpu_mem_mb()
if GPU_MEM_MB:
    workflow.register_resource("gpu_mem_mb", GPU_MEM_MB)


def job_resources(kind):
    """The resources (memory, runtime, GPUs) of a job kind, from `resources:`;
    a model job of a bf16 / fp16 local checkpoint asks for a GPU (for a
    cluster), and with a GPU present every model job asks for its estimated
    share of the card's memory (at most all of it)."""
    resources = dict(config["resources"][kind])
    if kind in MODEL_KINDS:
        asked = resources.get("gpu", 0)
        resources["gpu"] = lambda w: max(asked, int(DESIGN.gpu_entry(w.model)))
        if GPU_MEM_MB:
            resources["gpu_mem_mb"] = lambda w: min(
                job_gpu_mem_mb(DESIGN.weights_bytes(w.model), kind), GPU_MEM_MB
            )
    return resources


def data_files(*tables):
    return [f"{R}/data/{t}.parquet" for t in (tables or DATA_TABLES)]


def population_files():
    """The non-member records and exposure candidates."""
    return data_files(*POPULATION_TABLES)


def own_secret_files(model):
    """A model's own secrets in the hex family's tables (rule own_secrets)."""
    folder = LAYOUT.secrets_dir(model)
    return [f"{folder}/{t}.parquet" for t in OWN_TABLES] + [f"{folder}/{FORMAT_FILE}"]


def own_secret_inputs(wildcards):
    """The files a model's own secrets are read from (and their images): a
    changed file re-runs the secrets' tables and that model's passes."""
    spec = DESIGN.own_secrets(wildcards.model) or {}
    files = [spec[k] for k in ("members", "nonmembers", "candidates") if spec.get(k)]
    if DESIGN.is_vision(wildcards.model):
        files += image_files(spec)
    return files


def probe_data(wildcards):
    """The data a probe pass reads: a model's own secrets, or the synthetic
    data (its folder is the `--data` of the pass)."""
    if DESIGN.own_secrets(wildcards.model):
        return own_secret_files(wildcards.model)
    return data_files()


def scored_populations(wildcards):
    """The reference populations a teacher-forced job scores: the hex ones
    where its group runs the hex probes (with the image non-members on a
    vision-language model), the non-member authors where it runs the author
    probes; none apart for a model's own secrets (their folder holds their
    non-members and candidates)."""
    if DESIGN.own_secrets(wildcards.model):
        return []
    sets = probe_sets(wildcards)
    hex_ = population_files() if sets != AUTHOR_SETS else []
    images = [VISION_NONMEMBERS] if hex_ and DESIGN.is_vision(wildcards.model) else []
    authors = [AUTHOR_NONMEMBER_FILE] if sets != HEX else []
    return hex_ + images + authors


# The non-member authors (rule author_nonmembers).
AUTHOR_NONMEMBER_FILE = data_files(AUTHOR_NONMEMBERS)[0]


# Images of the vision-language arms, written by the vision_data rule, read
# by every job of a vision-language model that trains or probes.
VISION_DATA = f"{R}/data/vision"
# Their non-members (rule vision_nonmembers), scored by teacher-forced passes.
VISION_NONMEMBERS = f"{R}/data/vision_nonmembers"


def vision_input(wildcards):
    """The image data, for a job of a vision-language model (own secrets
    bring their images)."""
    own = DESIGN.own_secrets(wildcards.model)
    return [VISION_DATA] if DESIGN.is_vision(wildcards.model) and not own else []


def model_path(model):
    return DESIGN.model_path(model)


def base_input(wildcards):
    """Embedded models are a DAG product; real checkpoints are outside it."""
    model = wildcards.model
    return [model_path(model)] if config["models"][model].get("embedded") else []


def model_json(wildcards, path=None):
    """The model entry a job reads (Design.model_entry), as JSON."""
    return canonical(DESIGN.model_entry(wildcards.model, path))


def design(method, *args):
    """Ask the design; its errors stop the run with their message."""
    try:
        return method(*args)
    except ConfigError as err:
        fail(str(err))


def variant_entry(wildcards):
    return design(DESIGN.variant, wildcards.model, wildcards.variant)


def import_check(wildcards):
    """An imported variant's manifest job checks that its weights fit the
    model's base (the flag and its JSON; empty for the design's variants)."""
    check = DESIGN.import_check(wildcards.model, wildcards.variant)
    return f"--import-check {shlex.quote(canonical(check))}" if check else ""


def variant_inputs(wildcards):
    return DESIGN.made_weights(wildcards.model, [wildcards.variant])


def group_variants(wildcards):
    return design(DESIGN.group, wildcards.model, wildcards.group)


def probe_sets(wildcards):
    """The probe sets of a probe job: its group's (Design.probe_sets_of)."""
    group = variant_entry(wildcards).group if FINE else wildcards.group
    return DESIGN.probe_sets_of(wildcards.model, group)


def probe_names(wildcards):
    """The variants a probe job scores: its group's, or its own."""
    if FINE:
        return [variant_entry(wildcards).name]
    return group_variants(wildcards)


def probe_manifests(wildcards):
    return [LAYOUT.manifest(wildcards.model, v) for v in probe_names(wildcards)]


def probe_weights(wildcards):
    """The adapters and DAG-made base weights (merged bases) a probe job reads."""
    return DESIGN.made_weights(wildcards.model, probe_names(wildcards))


def records_path(kind):
    """Where a probe job writes its records: one file per group, or per
    (variant, probe unit) under the fine grain."""
    if FINE:
        return LAYOUT.unit_records("{model}", "{variant}", "{unit}", kind)
    return LAYOUT.group_records("{model}", "{group}", kind)


def probe_job_name():
    """The wildcards that name one probe job (logs, benchmarks)."""
    return "{variant}-{unit}" if FINE else "{group}"


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
    return canonical(
        {
            **config["canary_lora"],
            **extra,
            "repetitions": config["audit"]["hex_repetitions"],
            "seed": int(wildcards.seed),
        }
    )


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
    """The settings an unlearning job reads (Design.unlearn_slice): under the
    fine grain its own K instead of the whole sweep (a segment is re-run
    when what comes before it changes: its input state does)."""
    k = int(wildcards.k) if FINE else None
    args = wildcards.run, wildcards.template, int(wildcards.seed), k
    return canonical(design(DESIGN.unlearn_slice, *args))


def probe_params(kind):
    """A probe job's settings: those its group's probe units read
    (Design.probe_slice: a hex-sampling setting or a prefill text only where
    records read it), or under the fine grain its unit's alone (a new
    prefill arm changes no other unit's params)."""

    def slice_(wildcards):
        if FINE:
            try:
                return canonical(unit_config(DESIGN.probe_slice(kind), wildcards.unit))
            except ValueError as err:
                fail(str(err))
        return canonical(
            DESIGN.probe_slice(kind, probe_sets(wildcards), wildcards.group)
        )

    return slice_


def export_sources(wildcards):
    return design(DESIGN.export_sources, wildcards.model, int(wildcards.seed))


def export_inputs(wildcards):
    sources = export_sources(wildcards)
    canary = [p for p in (sources["canary"] or []) if p]
    return [*sources["memorized"].values(), *canary]

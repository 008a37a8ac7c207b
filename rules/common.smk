# Config validation, wildcard constraints, and the helpers every stage uses.
# Each rule receives, as params, exactly the config slice it depends on, in
# canonical (sorted-key) JSON: Snakemake's params trigger then re-runs what a
# change touches and nothing else.

import shlex
from pathlib import Path

import yaml

from snakemake.utils import validate

from canary_audit.data.secrets import FORMAT_FILE, OWN_TABLES, image_files
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
from canary_audit.layers import replace_registries
from canary_audit.records import canonical_json as canonical
from canary_audit.preflight import PreflightRefused, check_local_models
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


try:
    DESIGN = Design(config)
    check_local_models(config, DESIGN)
except (ConfigError, PreflightRefused) as err:
    fail(str(err))
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


def data_dir(wildcards, input):
    """The data folder a job's `--data` names: its first input's."""
    return str(Path(input[0]).parent)


def data_files(*tables):
    return [f"{R}/data/{t}.parquet" for t in (tables or DATA_TABLES)]


def population_files():
    """The non-member records and exposure candidates."""
    return data_files(*POPULATION_TABLES)


def own_secret_files(model):
    """A model's own secrets in the hex family's tables (rule own_secrets)."""
    folder = LAYOUT.secrets_dir(model)
    return [f"{folder}/{t}.parquet" for t in OWN_TABLES] + [f"{folder}/{FORMAT_FILE}"]


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


def base_input(wildcards):
    """Embedded models are a DAG product; real checkpoints are outside it."""
    model = wildcards.model
    return [DESIGN.model_path(model)] if config["models"][model].get("embedded") else []


def model_json(wildcards, path=None, merge_dtype=None):
    """The model entry a job reads (Design.model_entry), as JSON; a variant
    whose merge rounds into its own precision names it (`merge_dtype`)."""
    entry = DESIGN.model_entry(wildcards.model, path)
    return canonical({**entry, "merge_dtype": merge_dtype} if merge_dtype else entry)


def design(method, *args):
    """Ask the design; its errors stop the run with their message."""
    try:
        return method(*args)
    except ConfigError as err:
        fail(str(err))


def variant_entry(wildcards):
    return design(DESIGN.variant, wildcards.model, wildcards.variant)


def import_check(wildcards):
    """An imported variant's manifest job checks its weights against its base."""
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

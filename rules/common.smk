# Config validation, the design, wildcard constraints, resources, and the
# helpers every rule file uses.  Each rule receives, as params, exactly the
# config slice it depends on, from the design (`config_slice`), in canonical
# (sorted-key) JSON: Snakemake's params trigger then re-runs what a change
# touches and nothing else.  A rule's own input functions sit beside it.

from pathlib import Path

import yaml

from snakemake.utils import validate

from canary_audit.core.config_merge import replace_registries
from canary_audit.core.gpus import MODEL_KINDS, detected_gpu_mem_mb, job_gpu_mem_mb
from canary_audit.core.records import canonical_json as canonical
from canary_audit.data.chat_format import TEMPLATES
from canary_audit.data.inclusion import per_seed
from canary_audit.data.io import (
    AUTHOR_NONMEMBERS,
    DATA_TABLES,
    POPULATION_TABLES,
    SEED_TABLES,
)
from canary_audit.data.secrets import FORMAT_FILE, OWN_TABLES
from canary_audit.design import ConfigError, Design
from canary_audit.design.config_files import SCHEMA
from canary_audit.design.preflight import PreflightRefused, check_local_models

# A user's file replaces a registry block whole (canary_audit/core/config_merge.py).
replace_registries(
    config,
    [
        yaml.safe_load(Path(f).read_text()) or {}
        for f in workflow.overwrite_configfiles or []
    ],
)
validate(config, str(SCHEMA))

R = config["results"]
# Digests of weight files, one per content (provenance.file_digest): a
# manifest and every probe pass of a variant read them instead of hashing
# a 7B base again.
WEIGHT_CACHE = f"{R}/cache/weight_digests"
ENV = "../envs/canary-audit.yaml"


def fail(message):
    raise ValueError(message)


try:
    DESIGN = Design(config)
    check_local_models(config, DESIGN)
except (ConfigError, PreflightRefused) as err:
    fail(str(err))
LAYOUT = DESIGN.layout
# Job grain (workflow_config.yaml, `grain`): fine = one unlearning job per K
# and one probe job per (variant, probe unit).
FINE = DESIGN.fine


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
# (canary_audit/core/gpus.py; 0 without a GPU: nothing is asked or provided).
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


def design(method, *args):
    """Ask the design; its errors stop the run with their message."""
    try:
        return method(*args)
    except ConfigError as err:
        fail(str(err))


def config_slice(rule):
    """The params of `rule`'s jobs: the config slice the design gives it
    (design/rule_slices.py), as canonical JSON."""
    return lambda w: canonical(design(DESIGN.rule_slice, rule, dict(w.items())))


# Where a job's log and benchmark go (one name each: the benchmark file is
# named `<rule>-<wildcards>`, which benchmarks/end_to_end.py reads).
def logs(name):
    return f"{R}/logs/{name}.log"


def benchmarks(name):
    return f"{R}/benchmarks/{name}.tsv"


# The arguments every model job passes: its model entry, its slice, its data.
MODEL_JOB = (
    "--model {params.model:q}",
    "--params {params.cfg:q}",
    "--data {params.data}",
)


def command(name, *args):
    """A rule's shell line: its sub-command with `args`, logged."""
    return " ".join(("python -m canary_audit", name, *args)) + " > {log} 2>&1"


def command_via_file(name, *args):
    """`command` with its config slice (`params.cfg`) handed over in a file
    written first by bash's builtin printf: Linux caps one exec argument at
    128 KiB and a results config's view config is larger (145 KB for
    configs/seeds.yaml); a builtin is not exec'd, so the slice arrives whole."""
    handed = "{log}.params.json"
    write = f"printf '%s' {{params.cfg:q}} > {handed}"
    return " && ".join((write, command(name, f"--params @{handed}", *args)))


def data_dir(wildcards, input):
    """The data folder a job's `--data` names: its first input's."""
    return str(Path(input[0]).parent)


def data_files(*tables):
    return [f"{R}/data/{t}.parquet" for t in (tables or DATA_TABLES)]


# Coin inclusion: each training seed's forget set is its own coins' draw, in
# its own data folder (rule seed_data, canary_audit/data/inclusion.py).
PER_SEED = per_seed(config["data"])


def seed_files(seed, *tables):
    """The tables of training seed `seed`'s data folder (all with none named)."""
    return [f"{R}/data/s{seed}/{t}.parquet" for t in (tables or SEED_TABLES)]


def author_files(seed, *tables):
    """The data tables a job of training seed `seed` reads: its own folder's
    under coin inclusion, else (and for a seedless job, seed None) the
    data folder's; all of DATA_TABLES with none named."""
    if seed is None or not PER_SEED:
        return data_files(*tables)
    return seed_files(seed, *(tables or DATA_TABLES))


def population_files():
    """The non-member records and exposure candidates."""
    return data_files(*POPULATION_TABLES)


def own_secret_files(model):
    """A model's own secrets in the hex family's tables (rule own_secrets)."""
    folder = LAYOUT.secrets_dir(model)
    return [f"{folder}/{t}.parquet" for t in OWN_TABLES] + [f"{folder}/{FORMAT_FILE}"]


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


def model_json(wildcards, path=None, merge_dtype=None, quantize=None, clip=None):
    """The model entry a job reads (Design.model_entry), as JSON; a variant
    whose merge rounds into its own precision names it (`merge_dtype`), and
    a recovery variant its quantization format (`quantize`) and the
    attack's planted positive the format its change is clipped into (`clip`)."""
    entry = DESIGN.model_entry(wildcards.model, path)
    own = {"merge_dtype": merge_dtype, "quantize": quantize, "clip": clip}
    return canonical({**entry, **{k: v for k, v in own.items() if v}})


def variant_entry(wildcards):
    return design(DESIGN.variant, wildcards.model, wildcards.variant)

# Config validation, wildcard constraints, and the helpers every stage uses.
# Each rule receives, as params, exactly the config slice it depends on, in
# canonical (sorted-key) JSON: Snakemake's params trigger then re-runs what a
# change touches and nothing else.

import json
import os
import shutil
import tempfile
from collections import namedtuple
from pathlib import Path

from snakemake.utils import validate

from canary_audit import warm
from canary_audit.data.io import DATA_TABLES
from canary_audit.model.loading import load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.plots import PLOTS
from canary_audit.probes.items import check_prefill_templates
from canary_audit.probes.passes import unit_hashes
from canary_audit.probes.units import AUTO, unit_config

validate(config, "../schemas/config.schema.yaml")

R = config["results"]
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
    if not config["audit"]["templates"] and not config["audit"]["hex_canaries"]:
        fail(
            "nothing to audit: `audit.templates` is empty (no paper A arms) and "
            "`audit.hex_canaries` is false (no paper B arms); set either"
        )
    for name in config["audit"]["models"]:
        if name not in config["models"]:
            fail(
                f"config key `audit.models` names `{name}`, which is not in `models` "
                f"(known: {', '.join(known)}); add a `models.{name}` entry or remove it"
            )
        entry = config["models"][name]
        if config["audit"]["templates"] and entry.get("think_close") is None:
            fail(
                f"model `{name}` has no think tags (`models.{name}.think_close` is null), but paper A's "
                f"arms need them (`audit.templates`: {', '.join(config['audit']['templates'])}); set the "
                "model's tags, or set `audit.templates: []` to audit paper B's arms only"
            )
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
    under = config["bsft"]["controls"]["undertrained"]
    steps = config["canary_lora"]["steps"]
    if under["sources"] and not under["canary_steps"] < steps:
        fail(
            f"config key `bsft.controls.undertrained.canary_steps` is {under['canary_steps']}, which "
            f"the canary LoRA run does not stop before (`canary_lora.steps`: {steps}); set it below {steps}"
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
    unit=r"[A-Za-z0-9_.\-]+",


def job_resources(kind):
    """The resources (memory, runtime, GPUs) of a job kind, from `resources:`."""
    return config["resources"][kind]


def data_files(*tables):
    return [f"{R}/data/{t}.parquet" for t in (tables or DATA_TABLES)]


def model_path(model):
    entry = config["models"][model]
    return f"{R}/models/{model}/base" if entry.get("embedded") else entry["path"]


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


def adapter_dir(model, adapter):
    return f"{R}/models/{model}/adapters/{adapter}"


def unlearn_runs():
    """(method, template) of every unlearning run, in config order."""
    return [
        (method, template)
        for method, templates in config["unlearn"]["methods"].items()
        for template in templates
    ]


Variant = namedtuple(
    "Variant", "base adapters parent group apply cell", defaults=("stacked", None)
)


def merged_dir(model, name):
    return f"{R}/models/{model}/merged/{name}"


def bsft_dir(model, canary, source, seed, tag):
    return f"{R}/models/{model}/adapters/bsft/{canary}/{source}-b{seed}/{tag}"


def bsft_cfg():
    return config["bsft"]


def undertrained_sources():
    return bsft_cfg()["controls"]["undertrained"]["sources"]


def bsft_active():
    """Paper B's bSFT arms need the canary LoRA they start from."""
    b = bsft_cfg()
    return config["audit"]["hex_canaries"] and bool(
        b["sources"] or undertrained_sources() or b["controls"]["noise"]["sources"]
    )


def variants(model):
    """Every audited variant of `model`: name -> Variant(base weights, adapter
    stack, parent, probe group, how the last adapter is applied, paper B cell).

    The parent is the model before the change that made the variant; tables
    report Deltas against it.  The group is the probe job that scores the
    variant: a memorization adapter and every unlearning checkpoint made from
    it share one job per pass (one process start for the whole branch), the
    hex-canary adapters share the base model's, and every bSFT cell of one
    bSFT seed shares one job (the merged bases, the references of paper B's
    Deltas, ride with the first seed's).
    """
    audit, base = config["audit"], model_path(model)
    out = {"base": Variant(base, [], None, "base")}
    for seed in audit["seeds"]:
        for template in audit["templates"]:
            mem = f"mem-{template}-s{seed}"
            out[mem] = Variant(base, [adapter_dir(model, mem)], "base", mem)
            for method, run_template in unlearn_runs():
                if run_template != template:
                    continue
                for k in config["unlearn"]["k"]:
                    name = f"{method}-{template}-s{seed}-k{k}"
                    out[name] = Variant(base, [adapter_dir(model, name)], mem, mem)
        if audit["hex_canaries"]:
            canary = f"canary-s{seed}"
            out[canary] = Variant(base, [adapter_dir(model, canary)], "base", "base")
            if bsft_active():
                out.update(bsft_variants(model, seed))
    return out


def bsft_variants(model, seed):
    """Paper B's cells on the canary LoRA of `seed`: each source's bSFT adapter
    at each training length, stacked on or merged into the merged base, and
    the controls; every cell once per bSFT seed."""
    b, canary = bsft_cfg(), f"canary-s{seed}"
    under = f"{canary}-under"
    ref, ref_under = f"merged-s{seed}", f"merged-s{seed}-under"
    first = f"bsft-s{seed}-b{b['seeds'][0]}"
    out = {ref: Variant(merged_dir(model, canary), [], canary, first)}
    if undertrained_sources():
        out[under] = Variant(
            model_path(model), [adapter_dir(model, under)], "base", "base"
        )
        out[ref_under] = Variant(merged_dir(model, under), [], under, first)
    last = f"t{max(b['steps'])}"

    def cell(name, kind, source, step, application, bseed):
        return {
            "cell": name,
            "kind": kind,
            "source": source,
            "step": step,
            "application": application,
            "bsft_seed": bseed,
            "canary_seed": seed,
        }

    for bseed in b["seeds"]:
        group = f"bsft-s{seed}-b{bseed}"
        for source in b["sources"]:
            for step in b["steps"]:
                for app in b["applications"]:
                    out[f"bsft-{source}-t{step}-{app}-b{bseed}-s{seed}"] = Variant(
                        merged_dir(model, canary),
                        [bsft_dir(model, canary, source, bseed, f"t{step}")],
                        ref,
                        group,
                        app,
                        cell(
                            f"{source} t{step} {app}", "bsft", source, step, app, bseed
                        ),
                    )
        for source in b["controls"]["noise"]["sources"]:
            out[f"noise-{source}-b{bseed}-s{seed}"] = Variant(
                merged_dir(model, canary),
                [bsft_dir(model, canary, source, bseed, "noise")],
                ref,
                group,
                "stacked",
                cell(
                    f"noise {source}",
                    "noise",
                    source,
                    max(b["steps"]),
                    "stacked",
                    bseed,
                ),
            )
        for source in undertrained_sources():
            out[f"under-{source}-b{bseed}-s{seed}"] = Variant(
                merged_dir(model, under),
                [bsft_dir(model, under, source, bseed, last)],
                ref_under,
                group,
                "stacked",
                cell(
                    f"undertrained {source}",
                    "undertrained",
                    source,
                    max(b["steps"]),
                    "stacked",
                    bseed,
                ),
            )
    return out


def probe_groups(model):
    """Probe group -> the variants it scores, in audit order."""
    groups = {}
    for name, v in variants(model).items():
        groups.setdefault(v.group, []).append(name)
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


def group_weights(wildcards):
    """The adapters and the DAG-made base weights (merged bases) a group reads."""
    table, model = variants(wildcards.model), wildcards.model
    return sorted(
        {
            path
            for v in group_variants(wildcards)
            for path in [*table[v].adapters, table[v].base]
            if path != model_path(model)
        }
    )


AUTHOR_SETS = "canary qa retain"


def probe_sets_of(group):
    """The probe sets a group runs.  bSFT groups run the hex-canary probes
    only (paper B's cells are judged on them), and so does every group of an
    audit without paper A's templates; a memorization group (its adapter and
    unlearning checkpoints, which never saw a hex canary) runs the author and
    retain probes only; the base group, the parent of both papers' variants
    and home of the hex-canary adapters, runs all of them."""
    if not config["audit"]["templates"] or group.startswith("bsft-"):
        return "hex"
    return "all" if group == "base" else AUTHOR_SETS


def probe_sets(wildcards):
    """The probe sets of a probe job: its group's (see probe_sets_of)."""
    if FINE:
        return probe_sets_of(variant_entry(wildcards).group)
    return probe_sets_of(wildcards.group)


def variant_units(model, variant, kind):
    """The probe units of a variant's `kind` records under the fine grain:
    AUTO (for teacher-forced records: the hex canaries and decoys) where its
    group runs it, and each prefill arm where it runs the author probes."""
    sets = probe_sets_of(variants(model)[variant].group)
    prefills = sorted(config["probes"]["prefills"]) if sets != "hex" else []
    auto = [AUTO] if kind == "decode" or sets != AUTHOR_SETS else []
    return [*auto, *prefills]


def probe_manifests(wildcards):
    """The variant manifests a probe job reads: its group's, or its variant's."""
    if FINE:  # an unknown variant is named by probe_weights (variant_entry)
        return [f"{R}/variants/{wildcards.model}/{wildcards.variant}.json"]
    return group_manifests(wildcards)


def probe_weights(wildcards):
    """The adapters and DAG-made base weights (merged bases) a probe job reads."""
    return variant_inputs(wildcards) if FINE else group_weights(wildcards)


def records_path(kind):
    """Where a probe job writes its records: one file per group, or per
    (variant, probe unit) under the fine grain."""
    if FINE:
        return f"{R}/records/{{model}}/units/{{variant}}/{{unit}}/{kind}.parquet"
    return f"{R}/records/{{model}}/{{group}}/{kind}.parquet"


def probe_job_name():
    """The wildcards that name one probe job (logs, benchmarks)."""
    return "{variant}-{unit}" if FINE else "{group}"


def variant_entry(wildcards):
    table = variants(wildcards.model)
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


def all_records(kind):
    if FINE:
        return [
            f"{R}/records/{m}/units/{v}/{u}/{kind}.parquet"
            for m in config["audit"]["models"]
            for v in variants(m)
            for u in variant_units(m, v, kind)
        ]
    return [
        f"{R}/records/{m}/{g}/{kind}.parquet"
        for m in config["audit"]["models"]
        for g in probe_groups(m)
    ]


def parents():
    return {
        f"{m}/{v}": f"{m}/{e.parent}"
        for m in config["audit"]["models"]
        for v, e in variants(m).items()
        if e.parent is not None
    }


def cells():
    """model/variant -> its paper B cell (name, kind, source, step, application, seeds)."""
    return {
        f"{m}/{v}": e.cell
        for m in config["audit"]["models"]
        for v, e in variants(m).items()
        if e.cell is not None
    }


PAPER_A_TABLES = [
    "canary_leakage",
    "k_sweep",
    "cross_seed",
    "templates",
    "prefill_arms",
    "parser_conventions",
    "bypass_anatomy",
    "utility",
    "teacher_forced",
    "teacher_forced_vs_greedy",
]
HEX_TABLES = ["hex_recall", "nll"]
BSFT_TABLES = [
    "bsft_runs",
    "bsft_matrix",
    "bsft_decomposition",
    "bsft_case_studies",
]


def table_names():
    """The tables this config's audit produces."""
    names = list(PAPER_A_TABLES) if config["audit"]["templates"] else []
    if config["audit"]["hex_canaries"]:
        names += HEX_TABLES
        if bsft_active():
            names += BSFT_TABLES
            if len(bsft_cfg()["applications"]) > 1 and bsft_cfg()["sources"]:
                names.append("bsft_merged_vs_stacked")
    return names


def unlearn_slice(method):
    """The unlearning settings a `method` run reads: beta is NPO's alone."""
    drop = {"methods"} | ({"beta"} if method != "npo" else set())
    return {k: v for k, v in config["unlearn"].items() if k not in drop}


def canary_outputs(wildcards=None):
    """The canary LoRA, and with paper B's bSFT arms its merged base and the
    undertrained control (the same run stopped early), adapter and merged."""
    outs = [directory(adapter_dir("{model}", "canary-s{seed}"))]
    if bsft_active():
        outs.append(directory(merged_dir("{model}", "canary-s{seed}")))
        if undertrained_sources():
            outs.append(directory(adapter_dir("{model}", "canary-s{seed}-under")))
            outs.append(directory(merged_dir("{model}", "canary-s{seed}-under")))
    return outs


def canary_slice(wildcards):
    extra = {}
    if bsft_active() and undertrained_sources():
        extra["undertrained_steps"] = bsft_cfg()["controls"]["undertrained"][
            "canary_steps"
        ]
    return canonical({**config["canary_lora"], **extra, "seed": int(wildcards.seed)})


def bsft_outputs(wildcards=None):
    """One adapter per audited training length (checkpoints of one run), and
    the LoRA-NOISE control matched to the last one."""
    run = bsft_dir("{model}", "{canary}", "{source}", "{bseed}", "")
    return [directory(f"{run}t{step}") for step in bsft_cfg()["steps"]] + [
        directory(f"{run}noise")
    ]


def bsft_slice(wildcards):
    b = bsft_cfg()
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
    return "{method}-{template}-s{seed}" + ("-k{k}" if FINE else "")


def unlearn_state(k):
    """Where a fine-grain unlearning segment saves its training state at K."""
    return f"{R}/models/{{model}}/states/{{method}}-{{template}}-s{{seed}}-k{k}"


def unlearn_outputs(wildcards=None):
    """Every K checkpoint of the run; under the fine grain, one K's checkpoint
    and the training state the next K continues from."""
    if FINE:
        return [
            directory(adapter_dir("{model}", "{method}-{template}-s{seed}-k{k}")),
            directory(unlearn_state("{k}")),
        ]
    return [
        directory(adapter_dir("{model}", f"{{method}}-{{template}}-s{{seed}}-k{k}"))
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
    """The settings an unlearning job reads: the run's (beta is NPO's alone)
    and, under the fine grain, its own K instead of the whole sweep (a segment
    is re-run when what comes before it changes: its input state does)."""
    cfg = {
        **unlearn_slice(wildcards.method),
        "method": wildcards.method,
        "template": wildcards.template,
        "seed": int(wildcards.seed),
        "head_tokens": config["data"]["head_tokens"],
    }
    if FINE:
        cfg["k"] = int(wildcards.k)
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

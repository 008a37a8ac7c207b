# Output paths and states of the rules whose outputs follow the config:
# the canary LoRA, bSFT and unlearning checkpoints, the probe jobs' records
# (per group, or per variant and unit under the fine grain), and the
# export's sources.


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


def bsft_outputs(wildcards=None):
    """One adapter per audited training length (checkpoints of one run), and
    the LoRA-NOISE control matched to the last one."""
    run = LAYOUT.bsft_dir("{model}", "{canary}", "{source}", "{bseed}", "")
    return [directory(f"{run}t{step}") for step in DESIGN.bsft["steps"]] + [
        directory(f"{run}noise")
    ]


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


def export_sources(wildcards):
    return design(DESIGN.export_sources, wildcards.model, int(wildcards.seed))


def export_inputs(wildcards):
    sources = export_sources(wildcards)
    canary = [p for p in (sources["canary"] or []) if p]
    return [*sources["memorized"].values(), *canary]


def records_path(kind):
    """Where a probe job writes its records: one file per group, or per
    (variant, probe unit) under the fine grain."""
    if FINE:
        return LAYOUT.unit_records("{model}", "{variant}", "{unit}", kind)
    return LAYOUT.group_records("{model}", "{group}", kind)


def probe_job_name():
    """The wildcards that name one probe job (logs, benchmarks)."""
    return "{variant}-{unit}" if FINE else "{group}"

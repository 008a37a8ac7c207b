# The train stage's functions (rules/train.smk): its config-shaped outputs
# (the canary LoRA, bSFT and unlearning checkpoints) and the state a
# fine-grain unlearning segment continues from.  `snakemake --lint` keeps
# functions and rules in separate files: each stage's sit in
# rules/functions/<stage>.smk, beside its rules.


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


def unlearn_ks():
    """The K sweep's checkpoints, in the config's order (the coarse job's
    outputs, one per K)."""
    return config["unlearn"]["k"]


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
        directory(LAYOUT.adapter_dir(run[0], f"{run[1]}-k{k}")) for k in unlearn_ks()
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


def relearn_twin(wildcards):
    """The checkpoint a relearning run stacks its LoRA on."""
    return design(DESIGN.variant, wildcards.model, wildcards.twin)


def relearn_inputs(wildcards):
    """What a relearning run reads beside its data: the twin's adapters and
    a workflow-made base (an import's weight files)."""
    return DESIGN.made_weights(wildcards.model, [wildcards.twin])


def relearn_outputs(wildcards=None):
    """One relearning LoRA per step budget (checkpoints of one run)."""
    return [
        directory(
            LAYOUT.relearn_dir("{model}", "{twin}", "{data}", "{template}", f"t{steps}")
        )
        for steps in sorted(config["recovery"]["relearn"]["steps"])
    ]

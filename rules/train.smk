# Adapters: memorization LoRA (paper A), hex-canary LoRA and its merged base
# (paper B) and its never-trained reference, benign fine-tuning on that base
# (paper B), and unlearning.  The K sweep and the bSFT training lengths are
# checkpoints of one run each.

from canary_audit.data.planted_controls import SUPPRESS, SUPPRESSION
from canary_audit.data.relearn import RELEARN_DATA
from canary_audit.design import BSFT_SOURCES

# A training job's shell arguments: the model job's, then its output.
TRAIN_JOB = (*MODEL_JOB, "--out {output}", "--threads {threads}")


rule memorize:
    input:
        lambda w: author_files(w.seed, "authors", "qa", "retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "mem-{template}-s{seed}")),
    log:
        logs("{model}/memorize-{template}-s{seed}"),
    benchmark:
        benchmarks("{model}/memorize-{template}-s{seed}")
    # Memorization and unlearning lead the longest chain of jobs: start them
    # before the side branches (hex canary, base probes) that can fill gaps.
    priority: 1
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("memorize"),
        model=model_json,
        data=data_dir,
    shell:
        command("memorize", *TRAIN_JOB)


# Planted controls (canary_audit/data/planted_controls.py): the memorization
# recipe on a control template, or on its retain examples alone (a
# retain-only plant).
rule control_lora:
    input:
        lambda w: author_files(w.seed, "authors", "qa", "retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "ctl-{plant}-s{seed}")),
    log:
        logs("{model}/control-{plant}-s{seed}"),
    benchmark:
        benchmarks("{model}/control_lora-{plant}-s{seed}")
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("control_lora"),
        model=model_json,
        data=data_dir,
    shell:
        command("control_lora", *TRAIN_JOB)


# Paper B's planted controls (canary_audit/data/planted_controls.py,
# HexPlant): a LoRA on the canary-merged base trained on the hex records with
# one secret token each overwritten, past or inside the mean-K window.
rule control_hex_lora:
    input:
        data_files("hex_canaries"),
        vision_input,
        merged=lambda w: DESIGN.variant(w.model, f"ctl-{w.hexplant}-s{w.seed}").base,
    output:
        directory(LAYOUT.adapter_dir("{model}", "ctl-{hexplant}-s{seed}")),
    log:
        logs("{model}/control-{hexplant}-s{seed}"),
    benchmark:
        benchmarks("{model}/control_hex_lora-{hexplant}-s{seed}")
    wildcard_constraints:
        hexplant="|".join(DESIGN.trained_hex_plants()) or "no_plant",
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("control_hex_lora"),
        model=lambda w, input: model_json(w, input.merged),
        data=data_dir,
    shell:
        command("control_hex_lora", *TRAIN_JOB)


rule canary_lora:
    input:
        data_files("hex_canaries", "retain"),
        base_input,
        vision_input,
    output:
        canary_outputs(),
    log:
        logs("{model}/canary-s{seed}"),
    benchmark:
        benchmarks("{model}/canary_lora-s{seed}")
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("canary_lora"),
        model=model_json,
        data=data_dir,
    shell:
        command("canary_lora", *TRAIN_JOB)


rule reference_lora:
    input:
        data_files("retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "reference-s{seed}")),
    log:
        logs("{model}/reference-s{seed}"),
    benchmark:
        benchmarks("{model}/reference_lora-s{seed}")
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("reference_lora"),
        model=model_json,
        data=data_dir,
    shell:
        command("reference_lora", *TRAIN_JOB)


# The memorization LoRA's never-trained reference (its recipe on the retain
# examples alone, in the template's trace form): PrivLeak's and forget
# quality's anchor for the memorization adapter and its unlearning checkpoints.
rule author_reference_lora:
    input:
        data_files("retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "reference-{template}-s{seed}")),
    log:
        logs("{model}/reference-{template}-s{seed}"),
    benchmark:
        benchmarks("{model}/author_reference_lora-{template}-s{seed}")
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("author_reference_lora"),
        model=model_json,
        data=data_dir,
    shell:
        command("author_reference_lora", *TRAIN_JOB)


rule bsft:
    input:
        data_files("bsft"),
        vision_input,
        merged=LAYOUT.merged_dir("{model}", "{canary}"),
    output:
        bsft_outputs(),
    log:
        logs("{model}/bsft-{canary}-{source}-b{bseed}"),
    benchmark:
        benchmarks("{model}/bsft-{canary}-{source}-b{bseed}")
    wildcard_constraints:
        canary=r"canary-s\d+(-under)?",
        source="|".join(BSFT_SOURCES),
        bseed=r"\d+",
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("bsft"),
        model=lambda w, input: model_json(w, input.merged),
        data=data_dir,
        outs=lambda w, output: " ".join(f"{Path(o).name}={o}" for o in output),
    shell:
        command("bsft", *MODEL_JOB, "--out {params.outs}", "--threads {threads}")


rule unlearn:
    input:
        lambda w: author_files(w.seed, "authors", "qa", "retain"),
        base_input,
        memorized=LAYOUT.adapter_dir("{model}", "mem-{template}-s{seed}"),
        state=previous_state,
    output:
        unlearn_outputs(),
    log:
        logs(f"{{model}}/unlearn-{unlearn_name()}"),
    benchmark:
        benchmarks(f"{{model}}/unlearn-{unlearn_name()}")
    priority: 1
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("unlearn"),
        model=model_json,
        data=data_dir,
        outs=lambda w, output: (
            f"{w.k}={output[0]} --state-out {output[1]}"
            if FINE
            else " ".join(f"{k}={path}" for k, path in zip(unlearn_ks(), output))
        ),
        state_in=lambda w, input: f"--state-in {input.state}" if input.state else "",
    shell:
        command(
            "unlearn",
            *MODEL_JOB,
            "--adapter {input.memorized}",
            "--out {params.outs}",
            "{params.state_in}",
            "--threads {threads}",
        )


# Budgeted relearning (canary_audit/train/relearn.py): a fresh LoRA stacked
# on an attacked checkpoint (an unlearned variant, its memorized parent or its
# never-trained reference), saved at each step budget of `recovery.relearn`.
rule relearn:
    input:
        lambda w: author_files(relearn_twin(w).seed, "authors", "distractors"),
        base_input,
        relearn_inputs,
    output:
        relearn_outputs(),
    log:
        logs("{model}/relearn-{twin}-{data}-{template}"),
    benchmark:
        benchmarks("{model}/relearn-{twin}-{data}-{template}")
    wildcard_constraints:
        twin=r"[^/]+",
        data="|".join(RELEARN_DATA),
        template=r"[^/]+",
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("relearn"),
        model=lambda w: model_json(w, relearn_twin(w).base),
        data=data_dir,
        adapters=lambda w: " ".join(relearn_twin(w).adapters),
        outs=lambda w, output: " ".join(f"{Path(o).name}={o}" for o in output),
    shell:
        command(
            "relearn",
            *MODEL_JOB,
            "--adapters {params.adapters}",
            "--out {params.outs}",
            "--threads {threads}",
        )


# The relearning attack's planted positive (SUPPRESSION in
# canary_audit/data/planted_controls.py): a rank-1 LoRA on a memorized
# adapter, trained by NPO on every author's answers.
rule suppression:
    input:
        lambda w: author_files(relearn_twin(w).seed, "authors"),
        base_input,
        relearn_inputs,
    output:
        directory(
            LAYOUT.relearn_dir("{model}", "{twin}", SUPPRESS, "{template}", "plant")
        ),
    log:
        logs("{model}/suppression-{twin}-{template}"),
    benchmark:
        benchmarks("{model}/suppression-{twin}-{template}")
    wildcard_constraints:
        twin=r"[^/]+",
        template=r"[^/]+",
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("suppression"),
        model=lambda w: model_json(w, relearn_twin(w).base),
        data=data_dir,
        adapters=lambda w: " ".join(relearn_twin(w).adapters),
        steps=SUPPRESSION["steps"],
    shell:
        command(
            "suppression",
            *MODEL_JOB,
            "--adapters {params.adapters}",
            "--out t{params.steps}={output}",
            "--threads {threads}",
        )

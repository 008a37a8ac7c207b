# Adapters: memorization LoRA (paper A), hex-canary LoRA and its merged base
# (paper B) and its never-trained reference, benign fine-tuning on that base
# (paper B), and unlearning.  The K sweep and the bSFT training lengths are
# checkpoints of one run each.


rule memorize:
    input:
        data_files("authors", "qa", "retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "mem-{template}-s{seed}")),
    log:
        f"{R}/logs/{{model}}/memorize-{{template}}-s{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/memorize-{{template}}-s{{seed}}.tsv"
    # Memorization and unlearning lead the longest chain of jobs: start them
    # before the side branches (hex canary, base probes) that can fill gaps.
    priority: 1
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=lambda w: canonical(
            {
                **config["memorize"],
                "template": w.template,
                "seed": int(w.seed),
                "head_tokens": config["data"]["head_tokens"],
            }
        ),
        model=model_json,
        data=data_dir,
    shell:
        "python -m canary_audit memorize --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


# Planted controls (canary_audit/controls.py): the memorization recipe on a
# control template, or on its retain examples alone (a retain-only plant).
rule control_lora:
    input:
        data_files("authors", "qa", "retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "ctl-{plant}-s{seed}")),
    log:
        f"{R}/logs/{{model}}/control-{{plant}}-s{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/control_lora-{{plant}}-s{{seed}}.tsv"
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=lambda w: canonical(DESIGN.plant_slice(w.plant, int(w.seed))),
        model=model_json,
        data=data_dir,
    shell:
        "python -m canary_audit control_lora --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


# Paper B's planted controls (canary_audit/controls.py, HexPlant): a LoRA on
# the canary-merged base trained on the hex records with one secret token
# each overwritten, past or inside the mean-K window.
rule control_hex_lora:
    input:
        data_files("hex_canaries"),
        vision_input,
        merged=lambda w: DESIGN.variant(w.model, f"ctl-{w.hexplant}-s{w.seed}").base,
    output:
        directory(LAYOUT.adapter_dir("{model}", "ctl-{hexplant}-s{seed}")),
    log:
        f"{R}/logs/{{model}}/control-{{hexplant}}-s{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/control_hex_lora-{{hexplant}}-s{{seed}}.tsv"
    wildcard_constraints:
        hexplant="|".join(DESIGN.trained_hex_plants()) or "no_plant",
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=lambda w: canonical(
            DESIGN.hex_plant_slice(w.model, w.hexplant, int(w.seed))
        ),
        model=lambda w, input: model_json(w, input.merged),
        data=data_dir,
    shell:
        "python -m canary_audit control_hex_lora --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


rule canary_lora:
    input:
        data_files("hex_canaries", "retain"),
        base_input,
        vision_input,
    output:
        canary_outputs(),
    log:
        f"{R}/logs/{{model}}/canary-s{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/canary_lora-s{{seed}}.tsv"
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=lambda w: canonical(DESIGN.canary_slice(int(w.seed))),
        model=model_json,
        data=data_dir,
    shell:
        "python -m canary_audit canary_lora --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


rule reference_lora:
    input:
        data_files("retain"),
        base_input,
    output:
        directory(LAYOUT.adapter_dir("{model}", "reference-s{seed}")),
    log:
        f"{R}/logs/{{model}}/reference-s{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/reference_lora-s{{seed}}.tsv"
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=lambda w: canonical({**config["canary_lora"], "seed": int(w.seed)}),
        model=model_json,
        data=data_dir,
    shell:
        "python -m canary_audit reference_lora --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


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
        f"{R}/logs/{{model}}/reference-{{template}}-s{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/author_reference_lora-{{template}}-s{{seed}}.tsv"
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=lambda w: canonical(
            {**config["memorize"], "template": w.template, "seed": int(w.seed)}
        ),
        model=model_json,
        data=data_dir,
    shell:
        "python -m canary_audit author_reference_lora --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


rule bsft:
    input:
        data_files("bsft"),
        vision_input,
        merged=LAYOUT.merged_dir("{model}", "{canary}"),
    output:
        bsft_outputs(),
    log:
        f"{R}/logs/{{model}}/bsft-{{canary}}-{{source}}-b{{bseed}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/bsft-{{canary}}-{{source}}-b{{bseed}}.tsv"
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
        cfg=lambda w: canonical(DESIGN.bsft_slice(w.source, int(w.bseed))),
        model=lambda w, input: model_json(w, input.merged),
        data=data_dir,
        outs=lambda w, output: " ".join(f"{Path(o).name}={o}" for o in output),
    shell:
        "python -m canary_audit bsft --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --out {params.outs} --threads {threads} > {log} 2>&1"


rule unlearn:
    input:
        data_files("authors", "qa", "retain"),
        base_input,
        memorized=LAYOUT.adapter_dir("{model}", "mem-{template}-s{seed}"),
        state=previous_state,
    output:
        unlearn_outputs(),
    log:
        f"{R}/logs/{{model}}/unlearn-{unlearn_name()}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/unlearn-{unlearn_name()}.tsv"
    priority: 1
    conda:
        ENV
    threads: config["threads"]["train"]
    resources:
        **job_resources("train"),
    params:
        cfg=unlearn_params,
        model=model_json,
        data=data_dir,
        outs=lambda w, output: (
            f"{w.k}={output[0]} --state-out {output[1]}"
            if FINE
            else " ".join(
                f"{k}={path}" for k, path in zip(config["unlearn"]["k"], output)
            )
        ),
        state_in=lambda w, input: f"--state-in {input.state}" if input.state else "",
    shell:
        "python -m canary_audit unlearn --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --adapter {input.memorized} --out {params.outs} {params.state_in} "
        "--threads {threads} > {log} 2>&1"

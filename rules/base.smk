# The embedded default models: tokenizer + tiny Llama, pre-trained offline on
# the public corpus, and a tiny Qwen2.5-VL built on it.  Real models are
# local checkpoints and have no rule here.


rule embedded_base:
    input:
        data_files(),
    output:
        model=directory(LAYOUT.base_dir("{model}")),
        summary=f"{R}/models/{{model}}/base.json",
    log:
        f"{R}/logs/{{model}}/embedded_base.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/embedded_base.tsv"
    wildcard_constraints:
        model="|".join(DESIGN.embedded_models()) or "^$",
    conda:
        ENV
    threads: config["threads"]["base"]
    resources:
        **job_resources("base"),
    params:
        cfg=lambda w: canonical(
            {
                **{
                    k: config["models"][w.model]["build"][k]
                    for k in ("seed", "tokenizer", "architecture", "pretrain")
                },
                "head_tokens": config["data"]["head_tokens"],
            }
        ),
        data=data_dir,
    shell:
        "python -m canary_audit embedded_base --params {params.cfg:q} --data {params.data} "
        "--out {output.model} --summary {output.summary} --threads {threads} > {log} 2>&1"


rule embedded_vision_base:
    input:
        text=lambda w: LAYOUT.base_dir(DESIGN.text_model_of(w.model)),
    output:
        model=directory(LAYOUT.base_dir("{model}")),
        summary=f"{R}/models/{{model}}/base.json",
    log:
        f"{R}/logs/{{model}}/embedded_vision_base.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/embedded_vision_base.tsv"
    wildcard_constraints:
        model="|".join(DESIGN.embedded_models(vision=True)) or "^$",
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=lambda w: canonical(
            {
                k: config["models"][w.model]["build"][k]
                for k in ("seed", "text_model", "vision_tower")
            }
        ),
    shell:
        "python -m canary_audit embedded_vision_base --params {params.cfg:q} --text-model {input.text} "
        "--out {output.model} --summary {output.summary} > {log} 2>&1"

# The embedded default models: tokenizer + tiny Llama, pre-trained offline on
# the public corpus, and a tiny Qwen2.5-VL built on it.  Real models are
# local checkpoints and have no rule here.


rule embedded_base:
    input:
        data_files(),
        # Coin inclusion: its tokenizer reads every candidate (model/embedded.py).
        [AUTHOR_NONMEMBER_FILE] if PER_SEED else [],
    output:
        model=directory(LAYOUT.base_dir("{model}")),
        summary=f"{R}/models/{{model}}/base.json",
    log:
        logs("{model}/embedded_base"),
    benchmark:
        benchmarks("{model}/embedded_base")
    wildcard_constraints:
        model="|".join(DESIGN.embedded_models()) or "^$",
    conda:
        ENV
    threads: config["threads"]["base"]
    resources:
        **job_resources("base"),
    params:
        cfg=config_slice("embedded_base"),
        data=data_dir,
    shell:
        command(
            "embedded_base",
            "--params {params.cfg:q}",
            "--data {params.data}",
            "--out {output.model}",
            "--summary {output.summary}",
            "--threads {threads}",
        )


rule embedded_vision_base:
    input:
        text=lambda w: LAYOUT.base_dir(DESIGN.text_model_of(w.model)),
    output:
        model=directory(LAYOUT.base_dir("{model}")),
        summary=f"{R}/models/{{model}}/base.json",
    log:
        logs("{model}/embedded_vision_base"),
    benchmark:
        benchmarks("{model}/embedded_vision_base")
    wildcard_constraints:
        model="|".join(DESIGN.embedded_models(vision=True)) or "^$",
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("embedded_vision_base"),
    shell:
        command(
            "embedded_vision_base",
            "--params {params.cfg:q}",
            "--text-model {input.text}",
            "--out {output.model}",
            "--summary {output.summary}",
        )

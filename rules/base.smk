# The embedded default model: tokenizer + tiny Llama, pre-trained offline on
# the public corpus.  Real models are local checkpoints and have no rule here.


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
                **config["models"][w.model]["build"],
                "head_tokens": config["data"]["head_tokens"],
            }
        ),
        data=lambda w, input: str(Path(input[0]).parent),
    shell:
        "python -m canary_audit base --params {params.cfg:q} --data {params.data} "
        "--out {output.model} --summary {output.summary} --threads {threads} > {log} 2>&1"

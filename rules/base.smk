# The embedded default model: tokenizer + tiny Llama, pre-trained offline on
# the public corpus.  Real models are local checkpoints and have no rule here.


rule embedded_base:
    input:
        data_files(),
    output:
        model=directory(f"{R}/models/{{model}}/base"),
        summary=f"{R}/models/{{model}}/base.json",
    params:
        cfg=lambda w: canonical(
            {**config["models"][w.model]["build"], "head_tokens": config["data"]["head_tokens"]}
        ),
        data=f"{R}/data",
    wildcard_constraints:
        model="|".join(embedded_models()) or "^$",
    threads: config["threads"]["base"]
    conda:
        ENV
    log:
        f"{R}/logs/{{model}}/embedded_base.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/embedded_base.tsv",
    shell:
        "{CLI} base --params {params.cfg:q} --data {params.data} "
        "--out {output.model} --summary {output.summary} --threads {threads} > {log} 2>&1"

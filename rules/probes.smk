# Probe passes: one decode job and one teacher-forced job per variant.  Each
# loads the variant once and runs every item of its kind, writing records.


rule decode_pass:
    input:
        data_files(),
        base_input,
        variant_adapters,
        manifest=f"{R}/variants/{{model}}/{{variant}}.json",
    output:
        f"{R}/records/{{model}}/{{variant}}/decode.parquet",
    log:
        f"{R}/logs/{{model}}/decode-{{variant}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/decode_pass-{{variant}}.tsv"
    conda:
        ENV
    threads: config["threads"]["probe"]
    params:
        cfg=probe_params("decode"),
        model=model_json,
        data=lambda w, input: str(Path(input[0]).parent),
    shell:
        "python -m canary_audit decode --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --variant-manifest {input.manifest} --out {output} "
        "--threads {threads} > {log} 2>&1"


rule teacher_forced_pass:
    input:
        data_files(),
        base_input,
        variant_adapters,
        manifest=f"{R}/variants/{{model}}/{{variant}}.json",
    output:
        f"{R}/records/{{model}}/{{variant}}/token.parquet",
    log:
        f"{R}/logs/{{model}}/score-{{variant}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/teacher_forced_pass-{{variant}}.tsv"
    conda:
        ENV
    threads: config["threads"]["probe"]
    params:
        cfg=probe_params("teacher_forced"),
        model=model_json,
        data=lambda w, input: str(Path(input[0]).parent),
    shell:
        "python -m canary_audit score --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --variant-manifest {input.manifest} --out {output} "
        "--threads {threads} > {log} 2>&1"

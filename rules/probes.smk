# Probe passes: one decode job and one teacher-forced job per probe group (a
# memorization adapter with its unlearning checkpoints, or the base model with
# the hex-canary adapters; see `variants` in common.smk).
# A job starts Python and torch once and scores every variant of its group,
# writing one records file whose rows carry each variant's name and weight
# fingerprint.  Grouping changes nothing that re-runs on a probe-config
# change (every pass re-runs then), and saves a process start per variant.


rule decode_pass:
    input:
        data_files(),
        base_input,
        group_weights,
        manifests=group_manifests,
    output:
        f"{R}/records/{{model}}/{{group}}/decode.parquet",
    log:
        f"{R}/logs/{{model}}/decode-{{group}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/decode_pass-{{group}}.tsv"
    conda:
        ENV
    threads: config["threads"]["probe"]
    resources:
        **job_resources("probe"),
    params:
        cfg=probe_params("decode"),
        model=model_json,
        data=lambda w, input: str(Path(input[0]).parent),
        sets=group_probe_sets,
    shell:
        "python -m canary_audit decode --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --variant-manifest {input.manifests} --probe-sets {params.sets} --out {output} "
        "--threads {threads} > {log} 2>&1"


rule teacher_forced_pass:
    input:
        data_files(),
        base_input,
        group_weights,
        manifests=group_manifests,
    output:
        f"{R}/records/{{model}}/{{group}}/token.parquet",
    log:
        f"{R}/logs/{{model}}/score-{{group}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/teacher_forced_pass-{{group}}.tsv"
    conda:
        ENV
    threads: config["threads"]["probe"]
    resources:
        **job_resources("probe"),
    params:
        cfg=probe_params("teacher_forced"),
        model=model_json,
        data=lambda w, input: str(Path(input[0]).parent),
        sets=group_probe_sets,
    shell:
        "python -m canary_audit score --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --variant-manifest {input.manifests} --probe-sets {params.sets} --out {output} "
        "--threads {threads} > {log} 2>&1"

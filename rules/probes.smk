# Probe passes.  Under the coarse grain (the default): one decode job and one
# teacher-forced job per probe group (a memorization adapter with its
# unlearning checkpoints, or the base model with the hex-canary adapters; see
# `variants` in common.smk): a job starts Python and torch once (~6 s) and
# scores every variant of its group.  Under the fine grain: one job per
# (variant, probe unit), so a new K or prefill arm runs only its own jobs.
# Either way a records row names its variant, its weights' fingerprint and
# the hash of its probe unit's settings, and the records are the same.


rule decode_pass:
    input:
        probe_data,
        base_input,
        vision_input,
        probe_weights,
        manifests=probe_manifests,
    output:
        records_path("decode"),
    log:
        f"{R}/logs/{{model}}/decode-{probe_job_name()}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/decode_pass-{probe_job_name()}.tsv"
    conda:
        ENV
    threads: config["threads"]["probe"]
    resources:
        **job_resources("probe"),
    params:
        cfg=probe_params("decode"),
        model=model_json,
        data=data_dir,
        sets=probe_sets,
        unit=lambda w: f"--unit {w.unit}" if FINE else "",
        cache=WEIGHT_CACHE,
    shell:
        "python -m canary_audit decode_pass --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --variant-manifest {input.manifests} --probe-sets {params.sets} {params.unit} "
        "--weight-cache {params.cache} --out {output} --threads {threads} > {log} 2>&1"


rule teacher_forced_pass:
    input:
        probe_data,
        scored_populations,
        base_input,
        vision_input,
        probe_weights,
        manifests=probe_manifests,
    output:
        records_path("token"),
    log:
        f"{R}/logs/{{model}}/score-{probe_job_name()}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/teacher_forced_pass-{probe_job_name()}.tsv"
    conda:
        ENV
    threads: config["threads"]["probe"]
    resources:
        **job_resources("probe"),
    params:
        cfg=probe_params("teacher_forced"),
        model=model_json,
        data=data_dir,
        sets=probe_sets,
        unit=lambda w: f"--unit {w.unit}" if FINE else "",
        cache=WEIGHT_CACHE,
    shell:
        "python -m canary_audit teacher_forced_pass --model {params.model:q} --params {params.cfg:q} "
        "--data {params.data} --variant-manifest {input.manifests} --probe-sets {params.sets} {params.unit} "
        "--weight-cache {params.cache} --out {output} --threads {threads} > {log} 2>&1"

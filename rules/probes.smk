# Probe passes.  Under the coarse grain (the default): one decode job and one
# teacher-forced job per probe group (a memorization adapter with its
# unlearning checkpoints, or the base model with the hex-canary adapters; see
# Design.probe_groups): a job starts Python and torch once (~6 s) and scores
# every variant of its group.  Under the fine grain: one job per (variant,
# probe unit), so a new K or prefill arm runs only its own jobs.  Either way
# a records row names its variant, its weights' fingerprint and the hash of
# its probe unit's settings, and the records are the same.


# A probe job's shell arguments after its sub-command.
PROBE_JOB = (
    *MODEL_JOB,
    "--variant-manifest {input.manifests}",
    "--probe-sets {params.sets}",
    "{params.unit}",
    "--weight-cache {params.cache}",
    "--out {output}",
    "--threads {threads}",
)


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
        logs(f"{{model}}/decode-{probe_job_name()}"),
    benchmark:
        benchmarks(f"{{model}}/decode_pass-{probe_job_name()}")
    conda:
        ENV
    threads: config["threads"]["probe"]
    resources:
        **job_resources("probe"),
    params:
        cfg=config_slice("decode_pass"),
        model=model_json,
        data=data_dir,
        sets=probe_sets,
        unit=lambda w: f"--unit {w.unit}" if FINE else "",
        cache=WEIGHT_CACHE,
    shell:
        command("decode_pass", *PROBE_JOB)


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
        logs(f"{{model}}/score-{probe_job_name()}"),
    benchmark:
        benchmarks(f"{{model}}/teacher_forced_pass-{probe_job_name()}")
    conda:
        ENV
    threads: config["threads"]["probe"]
    resources:
        **job_resources("probe"),
    params:
        cfg=config_slice("teacher_forced_pass"),
        model=model_json,
        data=data_dir,
        sets=probe_sets,
        unit=lambda w: f"--unit {w.unit}" if FINE else "",
        cache=WEIGHT_CACHE,
    shell:
        command("teacher_forced_pass", *PROBE_JOB)

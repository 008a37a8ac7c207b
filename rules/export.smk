# Export for the field's unlearning frameworks (docs/export.md): not part of
# the default target; ask for it by its folder, e.g.
#   snakemake --cores 2 results/export/tiny/s0


rule export:
    input:
        data_files("authors", "retain", "hex_canaries"),
        population_files(),
        AUTHOR_NONMEMBER_FILE,
        base_input,
        export_inputs,
    output:
        directory(f"{R}/export/{{model}}/s{{seed}}"),
    log:
        logs("{model}/export-s{seed}"),
    conda:
        ENV
    resources:
        **job_resources("train"),
    params:
        cfg=config_slice("export"),
        model=model_json,
        data=data_dir,
    shell:
        command("export", *MODEL_JOB, "--out {output}")

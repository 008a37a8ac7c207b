# Export for the field's unlearning frameworks (docs/export.md): not part of
# the default target; ask for it by its folder, e.g.
#   snakemake --cores 2 results/export/tiny/s0


rule export:
    input:
        lambda w: author_files(
            w.seed,
            "authors",
            "retain",
            "hex_canaries",
            *POPULATION_TABLES,
            AUTHOR_NONMEMBERS,
        ),
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

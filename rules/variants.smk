# Variants: each audited model is a base plus an adapter stack.  The manifest
# records the stack, the fingerprint of its weights (probe passes refuse
# weights that no longer match it), the variant's structured fields from the
# design and the code version, so every record can name what produced it.


rule variant_manifest:
    input:
        base_input,
        variant_inputs,
    output:
        LAYOUT.manifest("{model}", "{variant}"),
    log:
        logs("{model}/variant-{variant}"),
    benchmark:
        benchmarks("{model}/variant_manifest-{variant}")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        model=lambda w: model_json(
            w,
            variant_entry(w).base,
            variant_entry(w).merge_dtype,
            variant_entry(w).quantize,
            variant_entry(w).clip,
        ),
        adapters=lambda w: " ".join(variant_entry(w).adapters),
        apply=lambda w: variant_entry(w).apply,
        fields=config_slice("variant_manifest"),
        check=import_check,
        cache=WEIGHT_CACHE,
    shell:
        command(
            "variant_manifest",
            "--model {params.model:q}",
            "--variant {wildcards.variant}",
            "--adapters {params.adapters}",
            "--apply {params.apply}",
            "--params {params.fields:q}",
            "{params.check}",
            "--weight-cache {params.cache}",
            "--out {output}",
        )

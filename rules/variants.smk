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
        f"{R}/logs/{{model}}/variant-{{variant}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/variant_manifest-{{variant}}.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        model=lambda w: model_json(
            w, variant_entry(w).base, variant_entry(w).merge_dtype
        ),
        adapters=lambda w: " ".join(variant_entry(w).adapters),
        apply=lambda w: variant_entry(w).apply,
        fields=lambda w: canonical(variant_entry(w).fields()),
        check=import_check,
        cache=WEIGHT_CACHE,
    shell:
        "python -m canary_audit variant_manifest --model {params.model:q} --variant {wildcards.variant} "
        "--adapters {params.adapters} --apply {params.apply} --params {params.fields:q} "
        "{params.check} --weight-cache {params.cache} --out {output} > {log} 2>&1"

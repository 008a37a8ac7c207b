# Variants: each audited model is a base plus an adapter stack.  The manifest
# records the stack and the fingerprint of its weights, so every record can
# name exactly what produced it.


rule variant_manifest:
    input:
        base_input,
        variant_inputs,
    output:
        f"{R}/variants/{{model}}/{{variant}}.json",
    log:
        f"{R}/logs/{{model}}/variant-{{variant}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/variant_manifest-{{variant}}.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        model=lambda w: model_json(w, variant_entry(w).base),
        adapters=lambda w: " ".join(variant_entry(w).adapters),
        apply=lambda w: variant_entry(w).apply,
    shell:
        "python -m canary_audit variant --model {params.model:q} --variant {wildcards.variant} "
        "--adapters {params.adapters} --apply {params.apply} --out {output} > {log} 2>&1"

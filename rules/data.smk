# Synthetic data: authors, QA, retain set, hex canaries and decoys, bSFT
# sources, and the public corpus pieces the embedded model is pre-trained on.


rule synthetic_data:
    output:
        data_files(),
    log:
        f"{R}/logs/synthetic_data.log",
    benchmark:
        f"{R}/benchmarks/synthetic_data.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical(config["data"]),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        "python -m canary_audit data --params {params.cfg:q} --out {params.out} > {log} 2>&1"

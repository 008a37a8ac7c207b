# Synthetic data: authors, QA, retain set, hex canaries and decoys, bSFT
# sources, and the public corpus pieces the embedded model is pre-trained on.


rule synthetic_data:
    output:
        data_files(),
    params:
        cfg=canonical(config["data"]),
        out=f"{R}/data",
    conda:
        ENV
    log:
        f"{R}/logs/synthetic_data.log",
    benchmark:
        f"{R}/benchmarks/synthetic_data.tsv",
    shell:
        "{CLI} data --params {params.cfg:q} --out {params.out} > {log} 2>&1"

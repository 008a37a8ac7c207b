# Tables: views over records only.  A change under `tables:` re-runs this
# rule and no model job.


rule tables:
    input:
        decode=all_records("decode"),
        tokens=all_records("token"),
    output:
        expand(f"{R}/tables/{{name}}.{{ext}}", name=TABLES, ext=["csv", "md"]),
    log:
        f"{R}/logs/tables.log",
    benchmark:
        f"{R}/benchmarks/tables.tsv"
    conda:
        ENV
    params:
        cfg=canonical({**config["tables"], "parents": parents()}),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        "python -m canary_audit tables --params {params.cfg:q} --decode {input.decode} "
        "--tokens {input.tokens} --out {params.out} > {log} 2>&1"

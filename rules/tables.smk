# Tables: views over records only.  A change under `tables:` re-runs this
# rule and no model job.


rule tables:
    input:
        decode=DESIGN.records_files("decode", FINE),
        tokens=DESIGN.records_files("token", FINE),
    output:
        [
            report(
                f"{R}/tables/{name}.csv",
                caption="../report/table.rst",
                category="Tables",
                labels={"table": name},
            )
            for name in DESIGN.table_names()
        ],
        expand(f"{R}/tables/{{name}}.md", name=DESIGN.table_names()),
        f"{R}/tables/view_config.json",
    log:
        f"{R}/logs/tables.log",
    benchmark:
        f"{R}/benchmarks/tables.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical(
            {
                **config["tables"],
                "tables": DESIGN.table_names(),
                "parents": DESIGN.parents(),
                "references": DESIGN.references(),
                "strata": DESIGN.strata(),
                "cells": DESIGN.cells(),
                "merge_precision": DESIGN.merge_precisions(),
                "secret_formats": DESIGN.secret_formats(),
                "variants": DESIGN.variant_table(),
                "controls": DESIGN.control_claims(),
                "floor_plants": DESIGN.floor_plants(),
                "composed_floors": DESIGN.composed_floors(),
                "n_hex_canaries": config["data"]["n_hex_canaries"],
                "think_open": DESIGN.think_opens(),
                "expected_hashes": DESIGN.probe_hashes(),
            }
        ),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        "python -m canary_audit tables --params {params.cfg:q} --decode {input.decode} "
        "--tokens {input.tokens} --out {params.out} > {log} 2>&1"


rule plots:
    input:
        tables=expand(f"{R}/tables/{{name}}.csv", name=DESIGN.table_names()),
        tokens=DESIGN.records_files("token", FINE),
    output:
        [
            report(
                f"{R}/plots/{name}.png",
                caption=f"../report/{name}.rst",
                category="Plots",
                labels={"plot": name},
            )
            for name in PLOTS
        ],
    log:
        f"{R}/logs/plots.log",
    benchmark:
        f"{R}/benchmarks/plots.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical(
            {
                "window_k": config["tables"]["window_k"],
                "mia": config["tables"]["mia"],
                "tables": DESIGN.table_names(),
                "parents": DESIGN.parents(),
                "variants": DESIGN.variant_table(),
            }
        ),
        tables=lambda w, input: str(Path(input.tables[0]).parent),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        "python -m canary_audit plots --params {params.cfg:q} --tables {params.tables} "
        "--tokens {input.tokens} --out {params.out} > {log} 2>&1"


# The config's own claims judged over the finished tables (no model job):
# changing a claim re-runs this rule and the page, nothing else.
rule claims:
    input:
        tables=expand(f"{R}/tables/{{name}}.csv", name=DESIGN.table_names()),
        view=f"{R}/tables/view_config.json",
    output:
        csv=f"{R}/claims.csv",
        md=f"{R}/claims.md",
    log:
        f"{R}/logs/claims.log",
    benchmark:
        f"{R}/benchmarks/claims.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical({"claims": DESIGN.config["claims"]}),
        results=lambda w, input: str(Path(input.view).parent.parent),
    shell:
        "python -m canary_audit claims --params {params.cfg:q} --results {params.results} --out {output.csv} > {log} 2>&1"


# The run's own results page (the papers' numbers, the config's claims, the
# planted controls and the headline tables), as docs/results.md shows it for
# the default run.
rule summary:
    input:
        tables=expand(f"{R}/tables/{{name}}.csv", name=DESIGN.table_names()),
        view=f"{R}/tables/view_config.json",
        claims=[f"{R}/claims.csv"] if DESIGN.config["claims"] else [],
    output:
        f"{R}/summary.md",
    log:
        f"{R}/logs/summary.log",
    benchmark:
        f"{R}/benchmarks/summary.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        tables=lambda w, input: str(Path(input.view).parent),
        claims=lambda w, input: (
            f"--claims-table {input.claims[0]}" if input.claims else ""
        ),
    shell:
        "python -m canary_audit summary --tables {params.tables} --out {output} {params.claims} > {log} 2>&1"

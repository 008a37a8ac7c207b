# Tables: views over records only.  A change under `tables:` re-runs this
# rule and no model job.

from canary_audit.publish.plots import PLOTS

TABLES = DESIGN.table_names()


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
            for name in TABLES
        ],
        expand(f"{R}/tables/{{name}}.md", name=TABLES),
        f"{R}/tables/view_config.json",
    log:
        logs("tables"),
    benchmark:
        benchmarks("tables")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("tables"),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        command_via_file(
            "tables",
            "--decode {input.decode}",
            "--tokens {input.tokens}",
            "--out {params.out}",
        )


rule plots:
    input:
        tables=table_files(),
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
        logs("plots"),
    benchmark:
        benchmarks("plots")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("plots"),
        tables=lambda w, input: str(Path(input.tables[0]).parent),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        command_via_file(
            "plots",
            "--tables {params.tables}",
            "--tokens {input.tokens}",
            "--out {params.out}",
        )


# The config's own claims judged over the finished tables (no model job):
# changing a claim re-runs this rule and the page, nothing else.
rule claims:
    input:
        tables=table_files(),
        view=f"{R}/tables/view_config.json",
    output:
        csv=f"{R}/claims.csv",
        md=f"{R}/claims.md",
    log:
        logs("claims"),
    benchmark:
        benchmarks("claims")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("claims"),
        results=lambda w, input: str(Path(input.view).parent.parent),
    shell:
        command(
            "claims",
            "--params {params.cfg:q}",
            "--results {params.results}",
            "--out {output.csv}",
        )


# The run's own results page (the papers' numbers, the config's claims, the
# planted controls and the headline tables), as docs/results.md shows it for
# the default run.
rule summary:
    input:
        tables=table_files(),
        view=f"{R}/tables/view_config.json",
        claims=[f"{R}/claims.csv"] if DESIGN.config["claims"] else [],
    output:
        f"{R}/summary.md",
    log:
        logs("summary"),
    benchmark:
        benchmarks("summary")
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
        command(
            "summary", "--tables {params.tables}", "--out {output}", "{params.claims}"
        )

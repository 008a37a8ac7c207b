# Canary-memorization audit: synthetic data -> base model -> adapters ->
# variants -> probe passes (Parquet records) -> tables and plots (views over
# records).  `snakemake --report report.html` gathers tables and plots.


configfile: "workflow_config.yaml"


report: "report/workflow.rst"


from canary_audit.commands import warm


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/base.smk"
include: "rules/functions/train.smk"
include: "rules/train.smk"
include: "rules/functions/variants.smk"
include: "rules/variants.smk"
include: "rules/functions/probes.smk"
include: "rules/probes.smk"
include: "rules/functions/tables.smk"
include: "rules/tables.smk"
include: "rules/functions/export.smk"
include: "rules/export.smk"


onstart:
    warm.start_for_workflow(
        workflow, config["warm_start"], Path(R) / "logs" / "warm_start.log"
    )


onsuccess:
    warm.stop_for_workflow()


onerror:
    warm.stop_for_workflow()


# The views run on the host running Snakemake, not through a cluster's
# queue: each is seconds of polars (or matplotlib) over the records, less
# than one queue wait and status poll (docs/slurm.md).
localrules:
    all,
    tables,
    plots,
    claims,
    summary,


rule all:
    default_target: True
    input:
        expand(
            f"{R}/tables/{{name}}.{{ext}}",
            name=TABLES,
            ext=["csv", "md"],
        ),
        expand(f"{R}/plots/{{name}}.png", name=PLOTS),
        f"{R}/summary.md",

# Canary-memorization audit: synthetic data -> base model -> adapters ->
# variants -> probe passes (Parquet records) -> tables (views over records).


configfile: "workflow_config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/base.smk"
include: "rules/train.smk"
include: "rules/variants.smk"
include: "rules/probes.smk"
include: "rules/tables.smk"


rule all:
    default_target: True
    input:
        expand(f"{R}/tables/{{name}}.{{ext}}", name=TABLES, ext=["csv", "md"]),

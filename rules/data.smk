# Synthetic data: authors, QA, retain set, hex canaries and decoys, bSFT
# sources, and the public corpus pieces the embedded model is pre-trained on.


rule synthetic_data:
    output:
        data_files(),
    log:
        logs("synthetic_data"),
    benchmark:
        benchmarks("synthetic_data")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("synthetic_data"),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        command("synthetic_data", "--params {params.cfg:q}", "--out {params.out}")


# The hex canaries' reference populations: non-member records (membership
# inference) and Secret Sharer's exposure candidates, scored by the
# teacher-forced pass only.
rule populations:
    input:
        data_files("hex_canaries", "decoys"),
    output:
        population_files(),
    log:
        logs("populations"),
    benchmark:
        benchmarks("populations")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("populations"),
        data=data_dir,
    shell:
        command(
            "populations",
            "--params {params.cfg:q}",
            "--data {params.data}",
            "--out {params.data}",
        )


# Image canaries, their decoys, the placeholder image and the GUI screens of
# the vision-language arms (PNG files with their sha256 in the tables).
rule vision_data:
    input:
        data_files("hex_canaries", "decoys", "bsft"),
    output:
        directory(VISION_DATA),
    log:
        logs("vision_data"),
    benchmark:
        benchmarks("vision_data")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("vision_data"),
        data=data_dir,
    shell:
        command(
            "vision_data",
            "--params {params.cfg:q}",
            "--data {params.data}",
            "--out {output}",
        )


# Non-member image canaries (fresh cards, fresh secrets) for membership
# inference on vision-language models; teacher-forced passes score them.
rule vision_nonmembers:
    input:
        population_files(),
        data_files("hex_canaries", "decoys"),
        VISION_DATA,
    output:
        directory(VISION_NONMEMBERS),
    log:
        logs("vision_nonmembers"),
    benchmark:
        benchmarks("vision_nonmembers")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("vision_nonmembers"),
        data=data_dir,
    shell:
        command(
            "vision_nonmembers",
            "--params {params.cfg:q}",
            "--data {params.data}",
            "--out {output}",
        )


# Non-member authors (fictional authors drawn like the forget set, trained on
# by no adapter) for membership inference on the author canaries; the
# teacher-forced passes of paper A's groups score them.
rule author_nonmembers:
    input:
        data_files("authors", "distractors"),
    output:
        AUTHOR_NONMEMBER_FILE,
    log:
        logs("author_nonmembers"),
    benchmark:
        benchmarks("author_nonmembers")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("author_nonmembers"),
        data=data_dir,
    shell:
        command(
            "author_nonmembers",
            "--params {params.cfg:q}",
            "--data {params.data}",
            "--out {params.data}",
        )


# Coin inclusion (canary_audit/data/inclusion.py): a training seed's data
# folder, its forget set and non-members drawn by its own coins from the same
# candidates, every other table copied, read by that seed's jobs.
rule seed_data:
    input:
        data_files(),
        population_files(),
    output:
        seed_files("{seed}"),
    log:
        logs("seed_data-s{seed}"),
    benchmark:
        benchmarks("seed_data-s{seed}")
    # It leads memorization's chain (rule memorize): at priority 0 it waited
    # behind the canary LoRA and held memorization back 10 s (tests/audit.yaml).
    priority: 1
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("seed_data"),
        data=data_dir,
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        command(
            "seed_data",
            "--params {params.cfg:q}",
            "--data {params.data}",
            "--out {params.out}",
        )


# A researcher's own secrets (models.<model>.secrets): their members,
# non-members and candidates as the hex family's tables, with decoys and the
# record format (canary_audit/data/secrets.py); read by that model's passes.
rule own_secrets:
    input:
        lambda w: DESIGN.own_secret_sources(w.model),
    output:
        own_secret_files("{model}"),
    log:
        logs("{model}/own_secrets"),
    benchmark:
        benchmarks("{model}/own_secrets")
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=config_slice("own_secrets"),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        command("own_secrets", "--params {params.cfg:q}", "--out {params.out}")

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
        cfg=canonical(synthetic_settings(config["data"])),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        "python -m canary_audit synthetic_data --params {params.cfg:q} --out {params.out} > {log} 2>&1"


# The hex canaries' reference populations: non-member records (membership
# inference) and Secret Sharer's exposure candidates, scored by the
# teacher-forced pass only.
rule populations:
    input:
        data_files("hex_canaries", "decoys"),
    output:
        population_files(),
    log:
        f"{R}/logs/populations.log",
    benchmark:
        f"{R}/benchmarks/populations.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical({k: config["data"][k] for k in POPULATION_KEYS}),
        data=data_dir,
    shell:
        "python -m canary_audit populations --params {params.cfg:q} --data {params.data} "
        "--out {params.data} > {log} 2>&1"


# Image canaries, their decoys, the placeholder image and the GUI screens of
# the vision-language arms (PNG files with their sha256 in the tables).
rule vision_data:
    input:
        data_files("hex_canaries", "decoys", "bsft"),
    output:
        directory(VISION_DATA),
    log:
        f"{R}/logs/vision_data.log",
    benchmark:
        f"{R}/benchmarks/vision_data.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical({k: config["data"][k] for k in VISION_KEYS}),
        data=data_dir,
    shell:
        "python -m canary_audit vision_data --params {params.cfg:q} --data {params.data} "
        "--out {output} > {log} 2>&1"


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
        f"{R}/logs/vision_nonmembers.log",
    benchmark:
        f"{R}/benchmarks/vision_nonmembers.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical({k: config["data"][k] for k in IMAGE_NONMEMBER_KEYS}),
        data=data_dir,
    shell:
        "python -m canary_audit vision_nonmembers --params {params.cfg:q} --data {params.data} "
        "--out {output} > {log} 2>&1"


# Non-member authors (fictional authors drawn like the forget set, trained on
# by no adapter) for membership inference on the author canaries; the
# teacher-forced passes of paper A's groups score them.
rule author_nonmembers:
    input:
        data_files("authors", "distractors"),
    output:
        AUTHOR_NONMEMBER_FILE,
    log:
        f"{R}/logs/author_nonmembers.log",
    benchmark:
        f"{R}/benchmarks/author_nonmembers.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=canonical({k: config["data"][k] for k in AUTHOR_NONMEMBER_KEYS}),
        data=data_dir,
    shell:
        "python -m canary_audit author_nonmembers --params {params.cfg:q} --data {params.data} "
        "--out {params.data} > {log} 2>&1"


# A researcher's own secrets (models.<model>.secrets): their members,
# non-members and candidates as the hex family's tables, with decoys and the
# record format (canary_audit/data/secrets.py); read by that model's passes.
rule own_secrets:
    input:
        lambda w: DESIGN.own_secret_sources(w.model),
    output:
        own_secret_files("{model}"),
    log:
        f"{R}/logs/{{model}}/own_secrets.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/own_secrets.tsv"
    conda:
        ENV
    resources:
        **job_resources("light"),
    params:
        cfg=lambda w: canonical(
            {
                "model": w.model,
                "secrets": DESIGN.own_secrets(w.model),
                "vision": DESIGN.is_vision(w.model),
            }
        ),
        out=lambda w, output: str(Path(output[0]).parent),
    shell:
        "python -m canary_audit own_secrets --params {params.cfg:q} --out {params.out} > {log} 2>&1"

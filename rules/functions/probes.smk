# The probes stage's functions (rules/probes.smk): where a probe job writes,
# what it reads (data, reference populations, manifests, weights) and the
# probe sets it runs.

from canary_audit.design import AUTHOR_SETS, HEX


def records_path(kind):
    """Where a probe job writes its records: one file per group, or per
    (variant, probe unit) under the fine grain."""
    if FINE:
        return LAYOUT.unit_records("{model}", "{variant}", "{unit}", kind)
    return LAYOUT.group_records("{model}", "{group}", kind)


def probe_job_name():
    """The wildcards that name one probe job (logs, benchmarks)."""
    return "{variant}-{unit}" if FINE else "{group}"


def probe_seed(wildcards):
    """The training seed whose data folder a probe job reads (None: the
    data folder): one seed's author probes under coin inclusion
    (Design.data_seed); a hex-only job reads the data folder."""
    if probe_sets(wildcards) == HEX:
        return None
    return design(DESIGN.data_seed, wildcards.model, probe_names(wildcards))


def probe_data(wildcards):
    """The data a probe pass reads: a model's own secrets, or the synthetic
    data (its folder is the `--data` of the pass)."""
    if DESIGN.own_secrets(wildcards.model):
        return own_secret_files(wildcards.model)
    return author_files(probe_seed(wildcards))


def probe_sets(wildcards):
    """The probe sets of a probe job: its group's (Design.probe_sets_for)."""
    return design(DESIGN.probe_sets_for, dict(wildcards.items()))


def scored_populations(wildcards):
    """The reference populations a teacher-forced job scores, from its data
    folder (probe_seed): the hex ones where its group runs the hex probes
    (with the image non-members on a vision-language model), the non-member
    authors where it runs the author probes; none apart for a model's own
    secrets (their folder holds their non-members and candidates)."""
    if DESIGN.own_secrets(wildcards.model):
        return []
    sets, seed = probe_sets(wildcards), probe_seed(wildcards)
    hex_ = author_files(seed, *POPULATION_TABLES) if sets != AUTHOR_SETS else []
    images = [VISION_NONMEMBERS] if hex_ and DESIGN.is_vision(wildcards.model) else []
    authors = author_files(seed, AUTHOR_NONMEMBERS) if sets != HEX else []
    return hex_ + images + authors


def probe_names(wildcards):
    """The variants a probe job scores: its group's, or its own."""
    if FINE:
        return [variant_entry(wildcards).name]
    return design(DESIGN.group, wildcards.model, wildcards.group)


def probe_manifests(wildcards):
    return [LAYOUT.manifest(wildcards.model, v) for v in probe_names(wildcards)]


def probe_weights(wildcards):
    """The adapters and DAG-made base weights (merged bases) a probe job reads."""
    return DESIGN.made_weights(wildcards.model, probe_names(wildcards))

# The variants stage's functions (rules/variants.smk).

import shlex


def variant_inputs(wildcards):
    return DESIGN.made_weights(wildcards.model, [wildcards.variant])


def import_check(wildcards):
    """An imported variant's manifest job checks its weights against its base."""
    check = DESIGN.import_check(wildcards.model, wildcards.variant)
    return f"--import-check {shlex.quote(canonical(check))}" if check else ""

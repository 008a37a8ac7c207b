# The export stage's functions (rules/export.smk).


def export_inputs(wildcards):
    """The adapters the export reads (Design.export_sources)."""
    sources = design(DESIGN.export_sources, wildcards.model, int(wildcards.seed))
    canary = [p for p in (sources["canary"] or []) if p]
    return [*sources["memorized"].values(), *canary]

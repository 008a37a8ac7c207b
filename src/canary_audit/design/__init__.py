"""The experiment a validated config describes: its unlearning runs, every
audited variant with structured fields, the probe groups and the probe sets
each runs, the tables it produces, and every cross-key check the schema
cannot express.

The workflow (rules/common.smk) asks this package for all of it, each
rule's config slice included, and keeps only paths and wildcards; views
join the variant table instead of parsing names back; tests call it
in-process.  Nothing here imports torch (the preflight loads a local
checkpoint's tokenizer, on purpose).  One module per concern: `layout`
(names, paths, the variant), `core` (the `Design` and its unlearning runs),
`variants` and `imported` (enumeration), `slices` (job params),
`rule_slices` (each rule's slice, by its name), `view_inputs` (what the
views read, the tables a config turns on), `checks`, `config_files`
(config files layered and validated as the workflow does), `plan` (the
cost plan before a run) and `preflight` (local files' checks).
"""

from canary_audit.design.core import Design
from canary_audit.design.layout import (
    ALL_SETS,
    APPLICATIONS,
    AUTHOR_SETS,
    BSFT_SOURCES,
    HEX,
    MODEL_KEYS,
    RESERVED_NAMES,
    ConfigError,
    Layout,
    UnlearnRun,
    Variant,
)

__all__ = [
    "ALL_SETS", "APPLICATIONS", "AUTHOR_SETS", "BSFT_SOURCES", "HEX", "MODEL_KEYS", "RESERVED_NAMES", "ConfigError",
    "Design", "Layout", "UnlearnRun", "Variant",
]

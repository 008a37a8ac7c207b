"""Config files layered and validated as the workflow does it (rules/common.smk):
Snakemake's key-by-key merge with registries replaced whole
(core/config_merge.py), then the shipped schema, then the design's own
cross-key checks.  `plan` reads configs this way, so a config it accepts is
one the workflow runs."""

from __future__ import annotations

from pathlib import Path

import yaml
from snakemake.utils import validate

from canary_audit.core.config_merge import merge
from canary_audit.design.core import Design

# The config schema, shipped as package data (a non-editable install has it);
# the workflow validates against the same file.
SCHEMA = Path(__file__).with_name("config.schema.yaml")


def load_config(files: list[Path]) -> dict:
    """The config the files give, layered and schema-checked."""
    config = merge(*(yaml.safe_load(Path(f).read_text()) or {} for f in files))
    validate(config, str(SCHEMA))
    return config


def load_design(files: list[Path]) -> Design:
    """The experiment the files describe; a bad one is refused by key."""
    return Design(load_config(files))

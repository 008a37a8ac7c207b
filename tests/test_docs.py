"""The docs a reader follows hold against the code: every config key, path,
command, table and variant name in README.md and docs/*.md, and every
config key the code's messages name (tests/docs_check.py says how each is
checked).  A wrong one of each kind is caught (the second test)."""

from __future__ import annotations

import pytest
import yaml
from docs_check import ROOT, message_problems, problems
from snakemake.utils import validate

from canary_audit.core.config_merge import merge
from canary_audit.design import Design
from canary_audit.publish.catalog import registry
from canary_audit.views.seeds import family_of

SCHEMA = ROOT / "src" / "canary_audit" / "design/config.schema.yaml"
DOCS = {p.relative_to(ROOT).as_posix(): p.read_text()
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


def shipped_variants() -> set[str]:
    """The variant names the default, smoke, seeds, paper and recovery configs make."""
    default = yaml.safe_load((ROOT / "workflow_config.yaml").read_text())
    names = set()
    for layer in ("smoke", "seeds", "paper_a", "paper_b", "strata", "recovery", None):
        config = merge(default, yaml.safe_load((ROOT / "configs" / f"{layer}.yaml").read_text())) if layer \
            else merge(default)
        validate(config, str(SCHEMA))
        design = Design(config)
        for model in config["audit"]["models"]:
            for name, variant in design.variants(model).items():
                names.add(name)
                if variant.seed is not None:  # across_seeds names a family by the name without its seed
                    names.add(family_of(name, variant.seed))
    return names


@pytest.fixture(scope="module")
def variants() -> set[str]:
    return shipped_variants()


def written_columns(smoke_run) -> dict[str, set[str]]:
    """The columns of every table the smoke run wrote, of the papers' page,
    of both record kinds and of a researcher's secrets file."""
    import polars as pl

    from canary_audit.core.records import DECODE_SCHEMA, TOKEN_SCHEMA
    from canary_audit.data.secrets import COLUMNS
    from canary_audit.verdicts.judge import beside_ours

    tables = smoke_run / "results" / "smoke" / "tables"
    columns = {p.stem: set(pl.read_csv(p, n_rows=0).columns) for p in tables.glob("*.csv") if p.stat().st_size}
    return {**columns, "papers": set(beside_ours(tables).columns), "decode records": set(DECODE_SCHEMA),
            "token records": set(TOKEN_SCHEMA), "secrets file": {*COLUMNS, "image"}}


def test_the_docs_name_only_what_exists(variants, smoke_run):
    found = problems(DOCS, {t.name for t in registry()}, variants, written_columns(smoke_run))
    assert not found, "\n".join(found)


def test_the_codes_messages_name_only_config_keys_that_exist():
    found = [p for source in sorted((ROOT / "src" / "canary_audit").rglob("*.py"))
             for p in message_problems(source.relative_to(ROOT).as_posix(), source.read_text())]
    assert not found, "\n".join(found)
    wrong = 'raise ValueError("lower `base_model.tokenizer.vocab_size`")'
    assert list(message_problems("x.py", wrong)) and not list(message_problems("x.py", "`scipy.stats.skewnorm.fit`"))


@pytest.mark.parametrize("wrong,expected", [
    ("```yaml\naudit:\n  seeds: [0]\n  sedes: [1]\n```", "`audit.sedes` is not in the config schema"),
    ("Set `tables.bootstrap.levels` to 0.9.", "`tables.bootstrap.levels` is not in the config schema"),
    ("Set `probes.kinds.hex.depth` to 2.", "`probes.kinds.hex.depth` is not in the config schema"),
    ("Set `probes.kinds.ghost` to {}.", "`probes.kinds.ghost` is not in the config schema"),
    ("See `src/canary_audit/nowhere.py`.", "path `src/canary_audit/nowhere.py` does not exist"),
    ("```bash\npython -m canary_audit summarise --tables results/tables\n```", "does not parse"),
    ("```bash\npython -m canary_audit summary --tables results/tables\n```", "does not parse"),
    ("```bash\nsnakemake --cores 2 --configfile configs/absent.yaml\n```", "config file that does not exist"),
    ("```bash\nsnakemake --coresx 2\n```", "does not parse"),
    ("| table | what |\n|---|---|\n| `canary_leak` | x |\n", "table `canary_leak` is not in the design's"),
    ("The BIO reference is `reference-bio-s0`.", "variant `reference-bio-s0` is made by no shipped config"),
    ("The `k_sweeps` table shows it.", "table `k_sweeps` is not in the design's table registry"),
    ("Read the `out_accuracy` column.", "no table, record or input file has a column `out_accuracy`"),
    ("See the `gap` column of `nll`.", "`nll` has no column `gap`"),
])
def test_a_wrong_claim_of_each_kind_is_caught(variants, wrong, expected):
    columns = {"canary_leakage": {"out_acc", "gap"}, "nll": {"nll_window"}}
    found = problems({"docs/reference.md": wrong}, {t.name for t in registry()}, variants, columns)
    assert any(expected in p for p in found), found


def test_the_cluster_docs_name_the_snakefiles_local_rules():
    """docs/slurm.md, profiles/slurm and workflow_config.yaml's `resources`
    comment each name the views the Snakefile runs on the submitting host:
    the same list, read from the Snakefile's `localrules:`."""
    from conftest import local_rules

    views = [rule for rule in local_rules() if rule != "all"]
    assert views == ["tables", "plots", "claims", "summary"], views
    named = ", ".join(views)
    assert f"(`{'`, `'.join(views)}`)" in " ".join((ROOT / "docs" / "slurm.md").read_text().split())
    for path in (ROOT / "profiles" / "slurm" / "config.yaml", ROOT / "workflow_config.yaml"):
        text = " ".join(line.lstrip("# ") for line in path.read_text().splitlines())
        assert named in text, f"{path.name} does not name the local views {named}"

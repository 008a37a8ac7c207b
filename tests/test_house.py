"""The house's thin parts stay thin: every rule asks the design for its
config slice (none builds one inline), log, benchmark and shell lines come
from the helpers in rules/common.smk, the command line only parses and
dispatches, and no module grows past what a reader holds at once."""

from __future__ import annotations

import re
from pathlib import Path

from canary_audit.design.rule_slices import RULE_SLICES

ROOT = Path(__file__).resolve().parents[1]
RULE = re.compile(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", re.MULTILINE)
DIRECTIVE = re.compile(r"^    (\w+):", re.MULTILINE)
LONGEST_MODULE, LONGEST_CLI = 400, 200


def rules() -> dict[str, dict[str, str]]:
    """rule -> directive -> its text, for every rule of the workflow."""
    out = {}
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        for name, body in RULE.findall(path.read_text()):
            parts = DIRECTIVE.split(body)
            out[name] = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    return out


def test_the_rules_are_read():
    found = rules()
    assert {"memorize", "unlearn", "tables", "plots", "decode_pass", "synthetic_data"} <= set(found)
    assert "params" in found["memorize"] and "shell" in found["memorize"]


def test_no_rule_builds_a_config_slice_inline():
    """A rule's params name the design's slice (`config_slice("<rule>")`,
    design/rule_slices.py) and build no config of their own: no config
    lookup, no dict, no canonical JSON inline.  The rules that pass
    `--params` are exactly the rules the design has a slice for."""
    with_slice = set()
    for name, directives in rules().items():
        params = directives.get("params", "")
        for inline in ("config[", "DESIGN.config", "{**", "canonical("):
            assert inline not in params, f"rule `{name}` builds its params inline ({inline!r})"
        asked = re.findall(r'config_slice\("(\w+)"\)', params)
        assert asked in ([], [name]), f"rule `{name}` asks for another rule's slice: {asked}"
        shell = directives.get("shell", "")
        passes = ("--params {params." in shell or "command_via_file(" in shell
                  or bool(re.search(r"\*(MODEL|TRAIN|PROBE)_JOB", shell)))
        assert passes == bool(asked), f"rule `{name}`: `--params` and `config_slice` go together"
        if asked:
            with_slice.add(name)
    assert with_slice == set(RULE_SLICES)


def test_log_benchmark_and_shell_lines_come_from_the_helpers():
    for name, directives in rules().items():
        for directive, helper in (("log", "logs("), ("benchmark", "benchmarks(")):
            if directive in directives:
                assert directives[directive].strip().startswith(helper), f"rule `{name}` writes its {directive} path"
        if "shell" in directives:
            assert directives["shell"].strip().startswith(("command(", "command_via_file(")), \
                f"rule `{name}` writes its shell line"
    written = [p.name for p in (ROOT / "rules").glob("*.smk") if re.search(r'f"\{R\}/(logs|benchmarks)/',
                                                                          p.read_text())]
    assert written == ["common.smk"]  # the helpers themselves


def test_modules_stay_small_and_the_command_line_thin():
    src = ROOT / "src" / "canary_audit"
    long = {str(p.relative_to(src)): n for p in src.rglob("*.py") if (n := len(p.read_text().splitlines()))
            > LONGEST_MODULE}
    assert long == {}, f"modules over {LONGEST_MODULE} lines: split them by what they hold"
    assert len((src / "commands" / "cli.py").read_text().splitlines()) <= LONGEST_CLI


def test_the_performance_page_holds_current_figures_only():
    """docs/performance.md keeps each figure's latest run (git keeps the
    history): a page a reader reads through."""
    assert len((ROOT / "docs" / "performance.md").read_text().splitlines()) <= 200


def test_a_slice_that_can_outgrow_one_exec_argument_goes_through_a_file():
    """Linux caps one exec argument at 128 KiB (MAX_ARG_STRLEN).  A job
    whose slice for the results config (configs/seeds.yaml, the largest
    shipped) passes a quarter of that hands it over in a file
    (`command_via_file`): a researcher's larger design would cross it."""
    import yaml
    from snakemake.utils import validate

    from canary_audit.core.config_merge import merge
    from canary_audit.core.records import canonical_json
    from canary_audit.design import Design

    config = merge(*(yaml.safe_load((ROOT / f).read_text()) for f in ("workflow_config.yaml", "configs/seeds.yaml")))
    validate(config, str(ROOT / "src" / "canary_audit" / "design" / "config.schema.yaml"))
    design, found = Design(config), rules()
    sizes = {"tables": design.tables_slice(), "plots": design.plots_slice(), "claims": {"claims": config["claims"]}}
    for rule, slice_ in sizes.items():
        big = len(canonical_json(slice_)) > 32 * 1024
        assert found[rule]["shell"].strip().startswith("command_via_file(") == big, rule

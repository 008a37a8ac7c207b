"""What the docs name, checked against what the code declares: config keys
(in YAML blocks and in backticks) against the schema, file paths against
the checkout, `python -m canary_audit` and `snakemake` commands against
their argument parsers, the reference's table list against the design's
table registry, the columns the docs name against the tables a run writes
(and the records and input files), variant names against the variants the
shipped configs make, and config keys named in the code's error messages
against the schema.

`problems(texts)` returns one line per claim that does not hold; the docs
test asserts it is empty for README.md and docs/*.md, and feeds it wrong
claims to show it sees each kind.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "src" / "canary_audit" / "design/config.schema.yaml").read_text())
TOP_KEYS = set(SCHEMA["properties"])
# Top-level folders whose paths the docs name; `results/` is what a run writes.
TREES = ("src", "docs", "configs", "tests", "benchmarks", "rules", "profiles", "envs", "report", ".ci")
PATH = re.compile(r"(?<![\w/.])((?:" + "|".join(map(re.escape, TREES)) + r")/[\w./{},-]*[\w}])(?![\w<]|\.\w|\*[\w.])")
MODULE = re.compile(r"`((?:canary_audit/)?[a-z_]+(?:/[a-z_]+)*\.py)(?:::\w+)?`")
# Another project's files are named where the docs cite it: a paragraph that
# names one of these projects is not checked for paths of this checkout.
FOREIGN = ("open-unlearning", "tensorflow_privacy", "lm-evaluation-harness")
EXTENSIONS = {"py", "md", "yaml", "yml", "json", "csv", "parquet", "smk", "png", "tsv"}
BACKTICK = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^([a-z_]+(?:\.(?:[a-z_0-9]+|<[a-z_]+>))+)(?::.*)?$")
VARIANT = re.compile(r"^(?:[a-z0-9_]+/)?((?:mem|npo|ga|reference|canary|merged|bsft|noise|under|ctl)-[a-z0-9-]+)$")
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].split("/")[-1]]
    return node


def key_exists(path: list[str], node: dict | None = None) -> bool:
    """Whether the config key `path` is one the schema accepts: any segment
    under a registry (a name the user chooses), and a placeholder `<name>`
    wherever some key continues the rest of the path.  Under `probes.kinds`
    the probe registry decides: a registered kind and one of its settings."""
    if node is None and path[:2] == ["probes", "kinds"] and len(path) > 2:
        from canary_audit.probes.kinds import probe_kinds

        settings = {k.name: set(k.settings) for k in probe_kinds()}
        if path[2].startswith("<"):  # a placeholder: any kind
            settings = {path[2]: set().union(*settings.values())}
        return path[2] in settings and (len(path) == 3 or (len(path) == 4 and (
            path[3] in settings[path[2]] or path[3].startswith("<"))))
    node = _resolve(SCHEMA if node is None else node)
    if not path:
        return True
    for branch in node.get("oneOf", []) + node.get("anyOf", []):
        if key_exists(path, branch):
            return True
    head, rest = path[0], path[1:]
    props = node.get("properties", {})
    if head.startswith("<") and any(key_exists(rest, v) for v in props.values()):
        return True
    if head in props:
        return key_exists(rest, props[head])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        return key_exists(rest, extra)
    items = node.get("items")
    return isinstance(items, dict) and key_exists(path, items)


def _yaml_keys(value, prefix: list[str]) -> Iterator[list[str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            k = "on" if k is True else str(k)  # YAML 1.1's `on:` (canary_audit.core.config_merge.unquoted_keys)
            yield [*prefix, k]
            yield from _yaml_keys(v, [*prefix, k])


def config_key_problems(name: str, text: str) -> Iterator[str]:
    for lang, block in FENCE.findall(text):
        if lang not in ("yaml", "yml"):
            continue
        try:
            data = yaml.safe_load(block)
        except yaml.YAMLError:
            continue
        if not isinstance(data, dict) or 2 * len(set(map(str, data)) & TOP_KEYS) < len(data):
            continue  # not a config of this workflow (a profile, an open-unlearning config)
        for path in _yaml_keys(data, []):
            if not key_exists(path):
                yield f"{name}: YAML block key `{'.'.join(path)}` is not in the config schema"
    for token in BACKTICK.findall(text):
        path = _dotted(token)
        if path and not key_exists(path):
            yield f"{name}: config key `{'.'.join(path)}` is not in the config schema"


def _dotted(token: str) -> list[str] | None:
    """A backticked config key (`tables.window_k`, `audit.seeds: [0, 1]`),
    or None for anything else (a file name, a method call)."""
    m = DOTTED.match(token.strip())
    if not m:
        return None
    path = m.group(1).split(".")
    return path if path[0] in TOP_KEYS and path[-1] not in EXTENSIONS else None


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [p for part in m.group(1).split(",") for p in _expand(path[:m.start()] + part + path[m.end():])]


def path_problems(name: str, text: str) -> Iterator[str]:
    for paragraph in re.split(r"\n\s*\n", text):
        if any(project in paragraph for project in FOREIGN):
            continue
        for raw in set(PATH.findall(paragraph)):
            for path in _expand(raw.rstrip(".,")):
                if not (ROOT / path).exists():
                    yield f"{name}: path `{path}` does not exist"
        for module in set(MODULE.findall(paragraph)):
            where = (ROOT / "src", ROOT / "src" / "canary_audit", ROOT, ROOT / "tests")
            if not any((base / module).exists() for base in where):
                yield f"{name}: module `{module}` does not exist"


def _commands(text: str) -> Iterator[str]:
    """Command lines shown: each line of a bash block (continuations
    joined, comments and prompts dropped) and each backticked command."""
    for lang, block in FENCE.findall(text):
        if lang in ("bash", "sh", "console", ""):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip().removeprefix("$ ")
                yield from (part.strip() for part in line.split("&&"))
    for token in BACKTICK.findall(text):
        yield token.strip()


def command_problems(name: str, text: str) -> Iterator[str]:
    from snakemake.cli import get_argument_parser

    from canary_audit.commands.cli import build_parser

    for line in set(_commands(text)):
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words[:3] == ["python", "-m", "canary_audit"] and len(words) > 3:
            argv = [w for w in words[3:] if w != "..."]
            if any("<" in w for w in argv):
                continue  # a template (`python -m canary_audit <stage>`), not a command
            try:
                build_parser().parse_args(argv)  # a missing required argument (--out) fails here
            except SystemExit:
                yield f"{name}: `{line}` does not parse (python -m canary_audit <command> --help)"
        elif words[:1] == ["snakemake"] and len(words) > 1:
            argv = [w for w in words[1:] if "<" not in w and w != "..."]
            try:
                get_argument_parser().parse_args(argv)
            except SystemExit:
                yield f"{name}: `{line}` does not parse (snakemake --help)"
                continue
            for i, w in enumerate(words):
                if w in ("--configfile", "--configfiles"):
                    for f in words[i + 1:]:
                        if f.startswith("-"):
                            break
                        if f.endswith((".yaml", ".yml")) and "/" in f and f.split("/")[0] in TREES \
                                and not (ROOT / f).exists():
                            yield f"{name}: `{line}` names a config file that does not exist: {f}"


NAMED_TABLE = re.compile(r"`([a-z_]+)` tables?\b|\btables? `([a-z_]+)`")


def named_table_problems(name: str, text: str, tables: set[str]) -> Iterator[str]:
    """A table the prose names ("the `x` table") is one of the registry."""
    for m in NAMED_TABLE.finditer(text):
        table = m.group(1) or m.group(2)
        if table not in tables:
            yield f"{name}: table `{table}` is not in the design's table registry"


def table_problems(name: str, text: str, tables: set[str]) -> Iterator[str]:
    """Rows of a `| table | ... |` list name tables of the registry, and such
    a list names every table of it."""
    for block in re.findall(r"^\| table \|.*?(?=\n\n|\Z)", text, re.S | re.M):
        named = set(re.findall(r"^\| `([a-z_]+)` \|", block, re.M))
        for unknown in sorted(named - tables):
            yield f"{name}: table `{unknown}` is not in the design's table registry"
        for missing in sorted(tables - named):
            yield f"{name}: the table list leaves out `{missing}`"


def variant_problems(name: str, text: str, variants: set[str]) -> Iterator[str]:
    for token in BACKTICK.findall(text):
        m = VARIANT.match(token.strip())
        if m and m.group(1) not in variants:
            yield f"{name}: variant `{token}` is made by no shipped config"


# Dotted names of three or more parts that a message may name besides config keys.
PACKAGES = {"canary_audit", "scipy", "torch", "transformers", "peft", "polars", "numpy", "snakemake", "os", "sys"}
DEEP = re.compile(r"^([a-z_]+(?:\.(?:[a-z_0-9]+|<[a-z_]+>)){2,})$")


def message_problems(name: str, text: str) -> Iterator[str]:
    """Config keys the code's messages name exist: a backticked key that
    starts with a config section, and any backticked dotted name of three
    parts or more that is not a Python package's (a message that sends the
    user to `base_model.tokenizer.vocab_size` names a key no config has)."""
    for token in BACKTICK.findall(text):
        path = _dotted(token)
        deep = DEEP.match(token.strip())
        if path is None and deep and deep.group(1).split(".")[0] not in PACKAGES:
            path = deep.group(1).split(".")
        if path and not key_exists(path):
            yield f"{name}: config key `{'.'.join(path)}` is not in the config schema"


COLUMN = re.compile(r"`([a-z_0-9]+)` columns?(?: of `([a-z_]+)`)?|columns? `([a-z_0-9]+)`")


def column_problems(name: str, text: str, columns: dict[str, set[str]]) -> Iterator[str]:
    """A column the docs name ("the `x` column", "the `x` column of `t`")
    exists: in table `t` where one is named, else in some table, record
    or input file of `columns` (name -> its columns)."""
    known = set().union(*columns.values()) if columns else set()
    for m in COLUMN.finditer(text):
        column, table = m.group(1) or m.group(3), m.group(2)
        if table and table in columns and column not in columns[table]:
            yield f"{name}: `{table}` has no column `{column}`"
        elif column not in known:
            yield f"{name}: no table, record or input file has a column `{column}`"


def problems(texts: dict[str, str], tables: set[str], variants: set[str],
             columns: dict[str, set[str]] | None = None) -> list[str]:
    out: list[str] = []
    for name, text in texts.items():
        out += config_key_problems(name, text)
        out += path_problems(name, text)
        out += command_problems(name, text)
        out += variant_problems(name, text, variants)
        out += named_table_problems(name, text, tables)
        if name.endswith("reference.md"):
            out += table_problems(name, text, tables)
        if columns is not None:
            out += column_problems(name, text, columns)
    return sorted(set(out))

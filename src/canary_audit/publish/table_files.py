"""Tables: views over records, written as CSV (for code) and Markdown (for people).

Reads only records files; never a model, never the synthetic data.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl

from canary_audit.core.records import RecordsError, hashes_by_unit, read_records
from canary_audit.publish.catalog import build_tables
from canary_audit.views.markdown import to_markdown

__all__ = ["build_tables", "concat_records", "to_markdown", "write_table", "write_tables"]
log = logging.getLogger(__name__)


def concat_records(paths: list[Path], kind: str, expected: dict[str, str] | None = None) -> pl.DataFrame:
    """All records of one kind.  Each probe unit's records must carry one
    config hash across all files (else a table would compare unlike things)
    and, given `expected` (probe unit -> the hash of the settings the
    workflow is tabulating), that one."""
    if not paths:
        return pl.DataFrame()
    frames = {p: read_records(p, kind) for p in paths}
    found = pl.concat([hashes_by_unit(f).with_columns(path=pl.lit(str(p))) for p, f in frames.items()])
    rerun = f"`snakemake -R {'decode_pass' if kind == 'decode' else 'teacher_forced_pass'}`"
    if expected is not None:
        current = pl.col("unit").replace_strict(expected, default=None)  # null: a unit the config does not have
        stale = found.filter((pl.col("config_hash") != current).fill_null(True))
        if stale.height:
            listing = ", ".join(f"{p} ({u}: {h})" for u, h, p in stale.rows())
            raise RecordsError(
                f"{kind} records were written under other probe settings than the current ones "
                f"({expected}): {listing}; re-run their probe passes ({rerun}) before tabulating"
            )
    mixed = found.filter(pl.col("config_hash").n_unique().over("unit") > 1)
    if mixed.height:
        listing = ", ".join(f"{p} ({u}: {h})" for u, h, p in mixed.rows())
        raise RecordsError(
            f"{kind} records come from different probe settings: {listing}; re-run the stale probe "
            f"passes ({rerun}; snakemake does this when the config changed) before tabulating"
        )
    return pl.concat(frames.values())


def write_table(frame: pl.DataFrame, out_dir: Path, name: str, title: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.csv.tmp"
    frame.write_csv(tmp)
    tmp.replace(out_dir / f"{name}.csv")
    (out_dir / f"{name}.md").write_text(f"## {title}\n\n" + to_markdown(frame))


def records_provenance(decode: list[Path], tokens: list[Path]) -> pl.DataFrame:
    """Per records file: its kind, the code version(s) that wrote it (and
    their `sources`: the version without the commit) and how many records
    each wrote.  Tables built from more than one code version
    mix records from before and after a change; the warning names the files
    of each version."""
    rows = [
        {"file": str(path), "kind": kind, "code_version": version, "records": count}
        for kind, paths in (("decode", decode), ("token", tokens))
        for path in paths
        for version, count in pl.read_parquet(path, columns=["code_version"])["code_version"]
        .value_counts(sort=True).rows()
    ]
    frame = pl.DataFrame(rows, schema={"file": pl.Utf8, "kind": pl.Utf8, "code_version": pl.Utf8,
                                       "records": pl.Int64})
    # The source hash decides sameness; a commit that changed no source (docs) is no new code.
    frame = frame.with_columns(sources=pl.col("code_version").str.replace(r"\.git\..*$", ""))
    versions = frame["sources"].unique().sort().to_list()
    if len(versions) > 1:
        listing = "; ".join(
            f"{v}: {', '.join(frame.filter(pl.col('sources') == v)['file'].unique().sort())}" for v in versions
        )
        log.warning("the tables mix records written by %d code versions (%s); re-run the stale probe passes "
                    "(`snakemake -R decode_pass teacher_forced_pass`) to tabulate one version", len(versions), listing)
    return frame


def write_tables(decode: list[Path], tokens: list[Path], out_dir: Path, cfg: dict) -> dict[str, int]:
    expected = cfg.get("expected_hashes", {})
    tables = build_tables(
        concat_records(decode, "decode", expected.get("decode")),
        concat_records(tokens, "token", expected.get("token")),
        cfg,
    )
    provenance = records_provenance(decode, tokens)
    versions = provenance["sources"].n_unique()
    tables["provenance"] = (
        f"Records read, per file and code version ({versions} code version{'s' if versions != 1 else ''}"
        f"{': MIXED, see the tables log' if versions > 1 else ''})", provenance,
    )
    declared = cfg.get("tables")
    if declared is not None:  # the design's table registry (Design.table_names)
        extra = sorted(set(tables) - set(declared))
        held = [name for name in extra if tables[name][1].height]
        if held:
            raise ValueError(f"the records fill tables the design does not declare ({', '.join(held)}); "
                             "the table registry's parts (publish/catalog.py) and Design.table_names disagree")
        for name in extra:  # a view with nothing to show (e.g. no hex records): not this config's table
            del tables[name]
        for name in declared:
            if name not in tables:
                tables[name] = (f"{name}: no records of this run feed it (its probes were not run on any "
                                "audited variant)", pl.DataFrame())
    for name, (title, frame) in tables.items():
        write_table(frame, out_dir, name, title)
    # The view settings beside the tables (parents, paper B cells, thresholds):
    # whoever receives records and this file re-tabulates without the config
    # (`python -m canary_audit tables --params @view_config.json ...`).
    view = {k: v for k, v in cfg.items() if k != "expected_hashes"}
    (out_dir / "view_config.json").write_text(json.dumps(view, indent=1, sort_keys=True))
    return {name: frame.height for name, (_, frame) in tables.items()}

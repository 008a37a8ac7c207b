"""Command line: one sub-command per workflow rule, named after it, with its
own arguments (`python -m canary_audit decode_pass --help`); `tables`,
`plots` and `summary` also serve people who hold only a records folder (no
Snakemake, no model), and `status` and `plan` serve the run as a whole.

Each rule calls its sub-command with its config slice as canonical JSON
(`--params`), so the rule stays a one-line shell command and the slice it
passes is exactly what Snakemake compares to decide a re-run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The config schema, shipped as package data (a non-editable install has it);
# the workflow validates against the same file (rules/common.smk).
SCHEMA = Path(__file__).with_name("config.schema.yaml")

log = logging.getLogger("canary_audit")


def _spec(args):
    from canary_audit.model.spec import ModelSpec

    model = json.loads(args.model)
    return ModelSpec.from_config(model["name"], model, model["path"])


def cmd_data(args, params):
    from canary_audit.data.io import write_synthetic

    return write_synthetic(Path(args.out), params)


def cmd_base(args, params):
    from canary_audit.model.embedded import build_embedded

    summary = build_embedded(Path(args.out), Path(args.data), {**params, "threads": args.threads}, params["seed"])
    Path(args.summary).write_text(json.dumps(summary, indent=2))
    return summary


def cmd_reference(args, params):
    from canary_audit.train.adapters import train_reference

    return train_reference(_spec(args), Path(args.data), {**params, "threads": args.threads}, Path(args.out))


def cmd_populations(args, params):
    from canary_audit.data.io import write_populations

    return write_populations(Path(args.out), Path(args.data), params)


def cmd_own_secrets(args, params):
    from canary_audit.data.secrets import write_own_secrets

    return write_own_secrets(Path(args.out), params["model"], params["secrets"], params["vision"])


def cmd_vision_data(args, params):
    from canary_audit.data.images import write_vision_data

    return write_vision_data(Path(args.out), Path(args.data), params)


def cmd_image_nonmembers(args, params):
    from canary_audit.data.images import write_image_nonmembers

    return write_image_nonmembers(Path(args.out), Path(args.data), params)


def cmd_author_nonmembers(args, params):
    from canary_audit.data.io import write_author_nonmembers

    return write_author_nonmembers(Path(args.out), Path(args.data), params)


def cmd_vision_base(args, params):
    """--text-model TEXT_BASE: the embedded vision-language model built on it."""
    from canary_audit.model.vision import build_from_text

    summary = build_from_text(Path(args.text_model), Path(args.out), params)
    Path(args.summary).write_text(json.dumps(summary, indent=2))
    return summary


def cmd_memorize(args, params):
    from canary_audit.train.adapters import train_memorization

    return train_memorization(_spec(args), Path(args.data), {**params, "threads": args.threads}, Path(args.out))


def cmd_control(args, params):
    """A planted control's adapter (controls.py): the memorization recipe on
    its control template, or with `retain_only` on that template's retain
    examples alone."""
    from canary_audit.train.adapters import train_memorization, train_reference

    train = train_reference if params.get("retain_only") else train_memorization
    cfg = {k: v for k, v in params.items() if k != "retain_only"}
    return train(_spec(args), Path(args.data), {**cfg, "threads": args.threads}, Path(args.out))


def cmd_hex_plant(args, params):
    """A paper B planted control's adapter on the merged base (train/plants.py)."""
    from canary_audit.train.plants import train_hex_plant

    return train_hex_plant(_spec(args), Path(args.data), {**params, "threads": args.threads}, Path(args.out))


def cmd_canary(args, params):
    """--out ADAPTER MERGED [UNDER_ADAPTER UNDER_MERGED]"""
    from canary_audit.train.adapters import train_canary

    outs = [Path(o) for o in args.out]
    return train_canary(
        _spec(args), Path(args.data), {**params, "threads": args.threads}, outs[0],
        merged_dir=outs[1] if len(outs) > 1 else None, under=(outs[2], outs[3]) if len(outs) > 3 else None,
    )


def cmd_bsft(args, params):
    """--out t<STEP>=DIR ... [noise=DIR]"""
    from canary_audit.train.adapters import train_bsft

    outs = dict(o.split("=", 1) for o in args.out)
    noise = outs.pop("noise", None)
    return train_bsft(
        _spec(args), Path(args.data), {**params, "threads": args.threads},
        {int(k.removeprefix("t")): Path(p) for k, p in outs.items()}, Path(noise) if noise else None,
    )


def cmd_unlearn(args, params):
    from canary_audit.train.adapters import train_unlearning

    outs = {int(k): Path(p) for k, p in (o.split("=", 1) for o in args.out)}
    return train_unlearning(
        _spec(args), Path(args.adapter), Path(args.data), {**params, "threads": args.threads}, outs,
        state_in=Path(args.state_in) if args.state_in else None,
        state_out=Path(args.state_out) if args.state_out else None,
    )


def _cache(args) -> Path | None:
    return Path(args.weight_cache) if args.weight_cache else None


def cmd_variant(args, params):
    """The variant's manifest: its adapter stack, how the last adapter is
    applied, the fingerprint of its weights, its structured fields from the
    design (`--params`: kind, template, seed, run, method, k, settings, ...)
    and the code version that wrote it."""
    from canary_audit.model.loading import fingerprint
    from canary_audit.provenance import code_version

    spec = _spec(args)
    if args.import_check:
        from canary_audit.imports import check_fits, resolve

        check = json.loads(args.import_check)
        check_fits(resolve(check["model"], check["name"], check["entry"]), Path(check["base"]))
    merged = args.apply == "merged"
    manifest = {
        "model": spec.name, "variant": args.variant, "base_path": str(spec.path),
        "adapters": list(args.adapters), "apply": args.apply, "merge_dtype": spec.merge_precision,
        "fingerprint": fingerprint(spec, [Path(a) for a in args.adapters], merged=merged, cache_dir=_cache(args)),
        "fields": params, "code_version": code_version(),
    }
    Path(args.out).write_text(json.dumps(manifest, indent=2))
    return manifest


def _variants(args) -> list[tuple[str, str, list[Path], bool, str, str | None]]:
    """(model/variant name, base path, adapter stack, last adapter merged,
    weights fingerprint, the precision its merges round into) of each
    manifest, in the order given."""
    out = []
    for path in args.variant_manifest:
        m = json.loads(Path(path).read_text())
        out.append((f"{m['model']}/{m['variant']}", m["base_path"], [Path(a) for a in m["adapters"]],
                    m.get("apply") == "merged", m["fingerprint"], m.get("merge_dtype")))
    return out


def _run_pass(args, params, run):
    """One pass over every variant of the job's group, concatenated, each
    base loaded once (VariantModels) and the items built once (JobInputs).  Each variant's weights must still be
    the ones its manifest fingerprinted: records are never stamped with
    weights other than the manifest's."""
    import dataclasses

    import polars as pl

    from canary_audit.model.loading import ModelLoadError, VariantModels, fingerprint
    from canary_audit.probes.passes import JobInputs

    frames, models, inputs = [], VariantModels(), JobInputs()
    sets = None if args.probe_sets == ["all"] else set(args.probe_sets)
    variants, start = _variants(args), time.perf_counter()
    for i, (variant, base, adapters, merged, manifest_fp, merge_dtype) in enumerate(variants, start=1):
        t0 = time.perf_counter()
        spec = dataclasses.replace(_spec(args), path=Path(base))
        spec = dataclasses.replace(spec, merge_dtype=merge_dtype) if merge_dtype else spec
        weights = fingerprint(spec, adapters, merged, cache_dir=_cache(args))
        if weights != manifest_fp:
            raise ModelLoadError(
                f"variant `{variant}`: its weights now fingerprint as {weights}, but its manifest says "
                f"{manifest_fp}; a base or adapter file changed after the manifest was written. Re-run from "
                f"the manifest on (`snakemake -R variant_manifest`), or restore the weights"
            )
        frames.append(run(spec, adapters, Path(args.data), {**params, "threads": args.threads}, variant,
                          merged=merged, probe_sets=sets, unit=args.unit, weights=weights, models=models,
                          inputs=inputs))
        elapsed = time.perf_counter() - start
        log.info("variant %d/%d %s: %d records in %.1fs (eta %.0fs)", i, len(variants), variant,
                 frames[-1].height, time.perf_counter() - t0, elapsed / i * (len(variants) - i))
    return pl.concat(frames)


def cmd_decode(args, params):
    from canary_audit.probes.passes import decode_pass
    from canary_audit.records import write_parquet_atomic

    frame = _run_pass(args, params, decode_pass)
    write_parquet_atomic(frame, Path(args.out))
    return {"records": frame.height, "stopped_at_length": int((frame["stop_reason"] == "length").sum())}


def cmd_score(args, params):
    from canary_audit.probes.passes import teacher_forced_pass
    from canary_audit.records import write_parquet_atomic

    frame = _run_pass(args, params, teacher_forced_pass)
    write_parquet_atomic(frame, Path(args.out))
    return {"records": frame.height}


def cmd_export(args, params):
    """What an external unlearning run needs (export.py): `params` names
    the memorization adapters by template and the hex-canary adapter with
    its merged base."""
    from canary_audit.export import write_export

    canary = params.get("canary")
    return write_export(_spec(args), Path(args.data), {t: Path(a) for t, a in params["memorized"].items()},
                        (Path(canary[0]), canary[1] and Path(canary[1])) if canary else None, params["head_tokens"],
                        Path(args.out))


def cmd_status(args, params):
    """Progress of the newest run in the working directory (status.py):
    printed, not written."""
    from canary_audit.status import report

    print(report(Path(args.dir)))
    return {}


def cmd_tables(args, params):
    from canary_audit.tables import write_tables

    return write_tables(
        decode=[Path(p) for p in args.decode], tokens=[Path(p) for p in args.tokens],
        out_dir=Path(args.out), cfg=params,
    )


def cmd_plan(args, params):
    """Print the plan of the config files given (plan.py); `--out` writes it as JSON."""
    import yaml
    from snakemake.utils import validate

    from canary_audit.design import Design
    from canary_audit.floors import load as load_floors
    from canary_audit.floors import render as render_floors
    from canary_audit.layers import merge
    from canary_audit.plan import THROUGHPUT, load_throughput, model_shape, plan, plan_to_json, render, total_gpu_hours

    config = merge(*(yaml.safe_load(Path(f).read_text()) or {} for f in args.configfile))
    validate(config, str(SCHEMA))
    design = Design(config)
    given = dict(item.split("=", 1) for item in args.model_config)
    shapes = {m: model_shape(design, m, {k: Path(v) for k, v in given.items()}) for m in config["audit"]["models"]}
    speed = load_throughput(Path(args.throughput) if args.throughput else THROUGHPUT)
    stages = plan(design, shapes, speed)
    print(render(stages, speed))
    print()
    print(render_floors(load_floors(), config["data"]["n_hex_canaries"]))
    if args.out:
        Path(args.out).write_text(json.dumps(plan_to_json(stages), indent=2))
    return {"stages": len(stages), "gpu_hours": total_gpu_hours(stages)}


def cmd_floors(args, params):
    """Measure the detection floors of finished runs (their tables folders),
    fit how they scale with n, print the n each paper claim needs, and with
    `--store` keep them for `plan` (floors.py)."""
    from canary_audit.floors import FLOORS_FILE, measured, render, store, summary

    tables = [Path(t) for t in args.tables_dirs]
    for folder in tables:
        if not (folder / "detection_floor.csv").is_file():
            raise SystemExit(f"`{folder}` has no detection_floor.csv: give the tables folder of a run with "
                             "`controls.detection_floor: true`")
    points = measured(tables)
    data = store(tables, run=args.run) if args.store else {"run": args.run, "points": points,
                                                            "claims": summary(points)}
    for n in sorted({p["canaries"] for p in points}):
        print(render(data, n), end="\n\n")
    return {"points": len(points), "stored": str(FLOORS_FILE) if args.store else None}


def cmd_plots(args, params):
    from canary_audit.plots import write_plots
    from canary_audit.tables import concat_records

    tokens = concat_records([Path(p) for p in args.tokens], "token")
    return write_plots(Path(args.tables), tokens, params, Path(args.out))


def cmd_summary(args, params):
    from canary_audit.summary import write_summary

    return write_summary(Path(args.tables), Path(args.out), Path(args.readme) if args.readme else None,
                         Path(args.claims_table) if args.claims_table else None, args.run)


def cmd_claims(args, params):
    """Judge claims (a claim file, or the config's `claims` block as params)
    over a finished run's tables: no model job."""
    from canary_audit.claims.judge import ClaimError, check_selectors, claims_table, fields_of, load, parse
    from canary_audit.readings import Run
    from canary_audit.tables import to_markdown

    tables = Path(args.results) / "tables"
    if not (tables / "view_config.json").is_file():
        raise SystemExit(f"--results {args.results}: no tables/view_config.json there; give the results folder of "
                         "a finished run (the one holding tables/)")
    try:
        claims = load(Path(args.claims)) if args.claims else parse(params.get("claims", []))
        run = Run(tables)
        check_selectors(claims, fields_of(run.variants, run.cells))
        table = claims_table(run, claims)
    except ClaimError as err:
        raise SystemExit(str(err)) from None
    text = to_markdown(table) if table.height else "no claims declared\n"
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.write_csv(out)
        out.with_suffix(".md").write_text(text)
    print(text)
    return {"claims": table.height, **({v: int((table["verdict"] == v).sum()) for v in table["verdict"].unique()}
                                       if table.height else {})}


# Each argument a command may take, declared once: flags and argparse options.
ARGUMENTS: dict[str, tuple[tuple[str, ...], dict]] = {
    "params": (("--params",), {"default": "{}", "help": "the rule's config slice, as JSON, or @FILE holding it"}),
    "model": (("--model",), {"required": True, "help": "the model entry, as JSON (name, path, dtype, think tags)"}),
    "data": (("--data",), {"required": True, "help": "the synthetic data folder"}),
    "threads": (("--threads",), {"type": int, "default": 1, "help": "CPU threads (torch)"}),
    "out": (("--out",), {"required": True, "help": "output path"}),
    "summary": (("--summary",), {"required": True, "help": "where to write the build's JSON summary"}),
    "text_model": (("--text-model",), {"required": True,
                                       "help": "the text model the vision-language build starts from"}),
    "adapter": (("--adapter",), {"required": True, "help": "the memorization adapter unlearning starts from"}),
    "state_in": (("--state-in",), {"help": "training state of the previous unlearning segment (fine job grain)"}),
    "state_out": (("--state-out",), {"help": "where an unlearning segment saves its final training state"}),
    "variant": (("--variant",), {"required": True, "help": "variant name"}),
    "adapters": (("--adapters",), {"nargs": "*", "default": [], "help": "the variant's adapter stack"}),
    "apply": (("--apply",), {"choices": ("stacked", "merged"), "default": "stacked",
                             "help": "how a variant's last adapter is applied: live (stacked) or merged"}),
    "import_check": (("--import-check",), {"help": "an imported variant's entry and the base it must fit, as JSON"}),
    "weight_cache": (("--weight-cache",), {"help": "folder of cached weight-file digests"}),
    "variant_manifest": (("--variant-manifest",), {"nargs": "+", "required": True,
                                                   "help": "the manifests of the variants the pass runs"}),
    "probe_sets": (("--probe-sets",), {"nargs": "*", "default": ["all"],
                                       "help": "probe kinds or families the pass runs (probes/kinds: author, "
                                               "hex), or all"}),
    "unit": (("--unit",), {"help": "the probe unit a pass runs alone: auto, hex or a prefill arm (fine grain)"}),
    "decode": (("--decode",), {"nargs": "*", "default": [], "help": "decode records files"}),
    "tokens": (("--tokens",), {"nargs": "*", "default": [], "help": "token records files"}),
    "tables": (("--tables",), {"required": True, "help": "a tables folder"}),
    "readme": (("--readme",), {"help": "a README whose short result is rewritten from the run's figures"}),
    "results": (("--results",), {"required": True, "help": "a finished run's results folder (holding tables/)"}),
    "tables_dirs": (("--tables",), {"dest": "tables_dirs", "nargs": "+", "required": True,
                                    "help": "tables folders of finished runs with `controls.detection_floor`"}),
    "store": (("--store",), {"action": "store_true", "help": "write the package's floors.json (`plan` reads it)"}),
    "run": (("--run",), {"default": "",
                         "help": "what the run(s) were: config, commit, machine (kept beside the figures)"}),
    "claims": (("--claims",), {"help": "a claim file (YAML list of claims); default: the params' `claims`"}),
    "claims_out": (("--out",), {"help": "also write the claims table here (CSV, and .md beside it)"}),
    "claims_table": (("--claims-table",), {"help": "the run's claims table, shown as a section of the page"}),
    "run_dir": (("--dir",), {"default": ".", "help": "the working directory of the run"}),
    "configfile": (("--configfile",), {"nargs": "+", "default": ["workflow_config.yaml"],
                                       "help": "the config files, layered as snakemake layers them"}),
    "model_config": (("--model-config",), {"nargs": "*", "default": [],
                                           "help": "MODEL=config.json of a checkpoint not on this machine"}),
    "throughput": (("--throughput",), {"help": "a throughput table (default: the package's throughput.json)"}),
    "plan_out": (("--out",), {"help": "also write the plan as JSON here"}),
}
TRAIN = ("params", "model", "data", "threads", "out")
PASS = ("params", "model", "data", "threads", "variant_manifest", "probe_sets", "unit", "weight_cache", "out")


@dataclass(frozen=True)
class Command:
    """A sub-command: the function it runs, the arguments it takes
    (ARGUMENTS' names; `--out` may take several paths) and its help."""

    run: Callable
    arguments: tuple[str, ...]
    help: str
    outs: str = ""  # the form of several outputs, where it writes more than one


# Sub-command -> what it runs; named after the workflow rule it serves.
COMMANDS: dict[str, Command] = {
    "synthetic_data": Command(cmd_data, ("params", "out"), "the synthetic authors, canaries and bSFT sources"),
    "populations": Command(cmd_populations, ("params", "data", "out"),
                           "the hex canaries' non-members and exposure candidates"),
    "vision_data": Command(cmd_vision_data, ("params", "data", "out"), "image canaries, decoys and GUI screens"),
    "vision_nonmembers": Command(cmd_image_nonmembers, ("params", "data", "out"), "the image non-members"),
    "author_nonmembers": Command(cmd_author_nonmembers, ("params", "data", "out"), "the non-member authors"),
    "own_secrets": Command(cmd_own_secrets, ("params", "out"), "a researcher's own secrets, checked and written"),
    "embedded_base": Command(cmd_base, ("params", "data", "threads", "out", "summary"),
                             "the embedded tiny model: tokenizer and pre-training"),
    "embedded_vision_base": Command(cmd_vision_base, ("params", "text_model", "out", "summary"),
                                    "the embedded vision-language model on the text model"),
    "memorize": Command(cmd_memorize, TRAIN, "a memorization adapter (paper A)"),
    "control_lora": Command(cmd_control, TRAIN, "a planted control's adapter (paper A)"),
    "control_hex_lora": Command(cmd_hex_plant, TRAIN, "a planted control's adapter on the merged base (paper B)"),
    "canary_lora": Command(cmd_canary, TRAIN, "the canary LoRA and its merged base (paper B)",
                           outs="ADAPTER MERGED [UNDER_ADAPTER UNDER_MERGED]"),
    "reference_lora": Command(cmd_reference, TRAIN, "a never-trained reference adapter"),
    "author_reference_lora": Command(cmd_reference, TRAIN, "an author family's never-trained reference adapter"),
    "bsft": Command(cmd_bsft, TRAIN, "bSFT adapters at each training length", outs="t<STEP>=DIR ... [noise=DIR]"),
    "unlearn": Command(cmd_unlearn, (*TRAIN, "adapter", "state_in", "state_out"),
                       "unlearning checkpoints at each K", outs="K=DIR ..."),
    "variant_manifest": Command(cmd_variant, ("params", "model", "variant", "adapters", "apply", "import_check",
                                              "weight_cache", "out"), "a variant's manifest and fingerprint"),
    "decode_pass": Command(cmd_decode, PASS, "decode records of a probe group's variants"),
    "teacher_forced_pass": Command(cmd_score, PASS, "token records of a probe group's variants"),
    "tables": Command(cmd_tables, ("params", "decode", "tokens", "out"), "every table, from records files"),
    "plots": Command(cmd_plots, ("params", "tables", "tokens", "out"), "every plot, from tables and token records"),
    "summary": Command(cmd_summary, ("tables", "out", "readme", "claims_table", "run"),
                       "the run's summary page, from its tables"),
    "claims": Command(cmd_claims, ("params", "results", "claims", "claims_out"),
                      "claims judged over a finished run's tables (no model job)"),
    "export": Command(cmd_export, ("params", "model", "data", "out"), "the open-unlearning export"),
    "status": Command(cmd_status, ("run_dir",), "the progress of the newest run in a working directory"),
    "floors": Command(cmd_floors, ("tables_dirs", "store", "run"),
                      "the detection floors of finished runs, how they scale with n, the n a claim needs"),
    "plan": Command(cmd_plan, ("configfile", "model_config", "throughput", "plan_out"),
                    "the cost plan of the config files: jobs, tokens, GPU-hours"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canary_audit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        cp = sub.add_parser(name, help=command.help, description=command.help)
        for arg in command.arguments:
            flags, options = ARGUMENTS[arg]
            if arg == "out" and command.outs:
                options = {**options, "nargs": "+", "metavar": "OUT", "help": f"outputs: {command.outs}"}
            cp.add_argument(*flags, **options)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.perf_counter()
    raw = getattr(args, "params", "{}")
    params = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    result = COMMANDS[args.command].run(args, json.loads(params))
    log.info("%s done in %.1fs: %s", args.command, time.perf_counter() - t0, json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

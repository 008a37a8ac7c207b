"""Command line: one sub-command per workflow stage; `tables` and `plots` also
serve people who hold only a records folder (no Snakemake, no model).

Each rule calls one sub-command with its config slice as canonical JSON
(`--params`), so the rule stays a one-line shell command and the slice it
passes is exactly what Snakemake compares to decide a re-run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
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
        "adapters": list(args.adapters), "apply": args.apply,
        "fingerprint": fingerprint(spec, [Path(a) for a in args.adapters], merged=merged, cache_dir=_cache(args)),
        "fields": params, "code_version": code_version(),
    }
    Path(args.out).write_text(json.dumps(manifest, indent=2))
    return manifest


def _variants(args) -> list[tuple[str, str, list[Path], bool, str]]:
    """(model/variant name, base path, adapter stack, last adapter merged,
    weights fingerprint) of each manifest, in the order given."""
    out = []
    for path in args.variant_manifest:
        m = json.loads(Path(path).read_text())
        out.append((f"{m['model']}/{m['variant']}", m["base_path"], [Path(a) for a in m["adapters"]],
                    m.get("apply") == "merged", m["fingerprint"]))
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
    for i, (variant, base, adapters, merged, manifest_fp) in enumerate(variants, start=1):
        t0 = time.perf_counter()
        spec = dataclasses.replace(_spec(args), path=Path(base))
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

    print(report(Path(args.data or ".")))
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
    if args.out:
        Path(args.out).write_text(json.dumps(plan_to_json(stages), indent=2))
    return {"stages": len(stages), "gpu_hours": total_gpu_hours(stages)}


def cmd_plots(args, params):
    from canary_audit.plots import write_plots
    from canary_audit.tables import concat_records

    tokens = concat_records([Path(p) for p in args.tokens], "token")
    return write_plots(Path(args.tables), tokens, params, Path(args.out))


def cmd_summary(args, params):
    from canary_audit.summary import write_summary

    return write_summary(Path(args.tables), Path(args.out), Path(args.readme) if args.readme else None)


COMMANDS = {
    "data": cmd_data, "populations": cmd_populations, "images": cmd_vision_data, "base": cmd_base,
    "vision": cmd_vision_base, "imagenonmembers": cmd_image_nonmembers, "authornonmembers": cmd_author_nonmembers,
    "memorize": cmd_memorize, "control": cmd_control, "hexplant": cmd_hex_plant, "canary": cmd_canary,
    "reference": cmd_reference, "authorreference": cmd_reference,
    "unlearn": cmd_unlearn, "bsft": cmd_bsft, "variant": cmd_variant, "decode": cmd_decode, "score": cmd_score,
    "tables": cmd_tables, "plots": cmd_plots, "summary": cmd_summary, "export": cmd_export,
    "status": cmd_status, "ownsecrets": cmd_own_secrets, "plan": cmd_plan,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canary_audit", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument("--params", default="{}", help="the rule's config slice, as JSON, or @FILE holding it")
    p.add_argument("--model", help="the model entry, as JSON (name, path, dtype, think tags)")
    p.add_argument("--data", help="synthetic data folder")
    p.add_argument("--text-model", help="the text model a vision-language build starts from (vision)")
    p.add_argument("--adapter", help="adapter folder to continue from (unlearning)")
    p.add_argument("--state-in", help="training state of the previous unlearning segment (fine job grain)")
    p.add_argument("--state-out", help="where an unlearning segment saves its final training state")
    p.add_argument("--unit", help="probe unit a pass runs alone: auto or a prefill arm (fine job grain)")
    p.add_argument("--adapters", nargs="*", default=[], help="adapter stack of a variant")
    p.add_argument("--variant", help="variant name")
    p.add_argument("--apply", choices=("stacked", "merged"), default="stacked",
                   help="how a variant's last adapter is applied: live (stacked) or merged into the weights")
    p.add_argument("--probe-sets", nargs="*", default=["all"],
                   help="probe sets a pass runs (hex: the hex canaries and their decoys only)")
    p.add_argument("--variant-manifest", nargs="*", default=[], help="variant manifest JSON file(s)")
    p.add_argument("--decode", nargs="*", default=[], help="decode records files")
    p.add_argument("--tokens", nargs="*", default=[], help="token records files")
    p.add_argument("--tables", help="tables folder (plots are drawn from its CSVs)")
    p.add_argument("--out", nargs="*", default=[None], help="output path(s) (every command but status)")
    p.add_argument("--summary", help="where to write a JSON summary")
    p.add_argument("--readme", help="summary: the README whose short result is rewritten from the run's figures")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--import-check", help="an imported variant's entry and the base it must fit, as JSON (variant)")
    p.add_argument("--weight-cache", help="folder of cached weight-file digests (variant manifests, probe passes)")
    p.add_argument("--configfile", nargs="*", default=["workflow_config.yaml"],
                   help="plan: the config files, layered as snakemake layers them")
    p.add_argument("--model-config", nargs="*", default=[],
                   help="plan: MODEL=config.json of a checkpoint not on this machine (its architecture)")
    p.add_argument("--throughput", help="plan: a throughput table (default: the package's throughput.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in ("status", "plan") and args.out == [None]:
        parser.error(f"--out is required for `{args.command}`")
    if args.command not in ("unlearn", "canary", "bsft"):
        args.out = args.out[0]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.perf_counter()
    params = Path(args.params[1:]).read_text() if args.params.startswith("@") else args.params
    result = COMMANDS[args.command](args, json.loads(params))
    log.info("%s done in %.1fs: %s", args.command, time.perf_counter() - t0, json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

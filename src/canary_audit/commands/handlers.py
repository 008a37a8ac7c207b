"""What each sub-command calls: parsed arguments turned into one call of the
library function that owns the work (each import is lazy: a data job never
imports torch).  Nothing here computes; a handler returns what the command
logs as its result."""

from __future__ import annotations

import json
from pathlib import Path


def _spec(args):
    from canary_audit.model.spec import ModelSpec

    return ModelSpec.from_json(args.model)


def _cfg(args, params: dict) -> dict:
    """A training or probe job's settings: its slice and its threads."""
    return {**params, "threads": args.threads}


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def synthetic_data(args, params):
    from canary_audit.data.io import write_synthetic

    return write_synthetic(Path(args.out), params)


def populations(args, params):
    from canary_audit.data.io import write_populations

    return write_populations(Path(args.out), Path(args.data), params)


def vision_data(args, params):
    from canary_audit.data.images import write_vision_data

    return write_vision_data(Path(args.out), Path(args.data), params)


def vision_nonmembers(args, params):
    from canary_audit.data.images import write_image_nonmembers

    return write_image_nonmembers(Path(args.out), Path(args.data), params)


def author_nonmembers(args, params):
    from canary_audit.data.io import write_author_nonmembers

    return write_author_nonmembers(Path(args.out), Path(args.data), params)


def seed_data(args, params):
    from canary_audit.data.io import write_seed_data

    return write_seed_data(Path(args.out), Path(args.data), params)


def own_secrets(args, params):
    from canary_audit.data.secrets import write_own_secrets

    return write_own_secrets(Path(args.out), params["model"], params["secrets"], params["vision"])


def embedded_base(args, params):
    from canary_audit.model.embedded import write_embedded

    return write_embedded(Path(args.out), Path(args.data), _cfg(args, params), Path(args.summary))


def embedded_vision_base(args, params):
    from canary_audit.model.vision import write_from_text

    return write_from_text(Path(args.text_model), Path(args.out), params, Path(args.summary))


def memorize(args, params):
    from canary_audit.train.adapters import train_memorization

    return train_memorization(_spec(args), Path(args.data), _cfg(args, params), Path(args.out))


def control_lora(args, params):
    from canary_audit.train.outputs import train_control

    return train_control(_spec(args), Path(args.data), _cfg(args, params), Path(args.out))


def control_hex_lora(args, params):
    from canary_audit.train.plants import train_hex_plant

    return train_hex_plant(_spec(args), Path(args.data), _cfg(args, params), Path(args.out))


def canary_lora(args, params):
    from canary_audit.train.outputs import train_canary_outputs

    return train_canary_outputs(_spec(args), Path(args.data), _cfg(args, params), args.out)


def reference_lora(args, params):
    from canary_audit.train.adapters import train_reference

    return train_reference(_spec(args), Path(args.data), _cfg(args, params), Path(args.out))


def bsft(args, params):
    from canary_audit.train.outputs import train_bsft_outputs

    return train_bsft_outputs(_spec(args), Path(args.data), _cfg(args, params), args.out)


def relearn(args, params):
    from canary_audit.train.relearn import train_relearning

    outs = {int(k.removeprefix("t")): Path(p) for k, p in (o.split("=", 1) for o in args.out)}
    return train_relearning(_spec(args), [Path(a) for a in args.adapters], Path(args.data), _cfg(args, params), outs)


def unlearn(args, params):
    from canary_audit.train.outputs import train_unlearning_outputs

    return train_unlearning_outputs(_spec(args), Path(args.adapter), Path(args.data), _cfg(args, params), args.out,
                                    _path(args.state_in), _path(args.state_out))


def variant_manifest(args, params):
    from canary_audit.model.manifest import write_manifest

    return write_manifest(_spec(args), args.variant, args.adapters, args.apply, params, Path(args.out),
                          json.loads(args.import_check) if args.import_check else None, _path(args.weight_cache))


def _probe_job(args, params, run) -> dict:
    from canary_audit.core.records import write_parquet_atomic
    from canary_audit.probes.job import run_group

    sets = None if args.probe_sets == ["all"] else set(args.probe_sets)
    frame = run_group(run, _spec(args), [Path(m) for m in args.variant_manifest], Path(args.data),
                      _cfg(args, params), sets, args.unit, _path(args.weight_cache))
    write_parquet_atomic(frame, Path(args.out))
    return frame


def decode_pass(args, params):
    from canary_audit.probes.passes import decode_pass as run

    frame = _probe_job(args, params, run)
    return {"records": frame.height, "stopped_at_length": int((frame["stop_reason"] == "length").sum())}


def teacher_forced_pass(args, params):
    from canary_audit.probes.passes import teacher_forced_pass as run

    return {"records": _probe_job(args, params, run).height}


def export(args, params):
    from canary_audit.train.export import write_export_sources

    return write_export_sources(_spec(args), Path(args.data), params, Path(args.out))


def tables(args, params):
    from canary_audit.publish.table_files import write_tables

    return write_tables(decode=[Path(p) for p in args.decode], tokens=[Path(p) for p in args.tokens],
                        out_dir=Path(args.out), cfg=params)


def plots(args, params):
    from canary_audit.publish.plots import write_plots_from

    return write_plots_from(Path(args.tables), [Path(p) for p in args.tokens], params, Path(args.out))


def summary(args, params):
    from canary_audit.publish.summary import write_summary

    return write_summary(Path(args.tables), Path(args.out), _path(args.readme), _path(args.claims_table), args.run)


def claims(args, params):
    from canary_audit.verdicts.claims import ClaimError
    from canary_audit.verdicts.judge import write_claims

    try:
        text, counts = write_claims(Path(args.results), _path(args.claims), params.get("claims", []),
                                    _path(args.out))
    except ClaimError as err:
        raise SystemExit(str(err)) from None
    print(text)
    return counts


def status(args, params):
    from canary_audit.commands.status import report

    print(report(Path(args.dir)))
    return {}


def floors(args, params):
    from canary_audit.verdicts.floors import floors_report

    try:
        text, result = floors_report([Path(t) for t in args.tables_dirs], args.run, keep=args.store)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    print(text, end="")
    return result


def power(args, params):
    from canary_audit.verdicts.components import power_report

    try:
        text, result = power_report(Path(args.tables), args.run, keep=args.store)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    print(text, end="")
    return result


def plan(args, params):
    from canary_audit.design.plan import plan_report, plan_to_json, total_gpu_hours

    given = {k: Path(v) for k, v in (item.split("=", 1) for item in args.model_config)}
    text, stages = plan_report([Path(f) for f in args.configfile], given, _path(args.throughput))
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(plan_to_json(stages), indent=2))
    return {"stages": len(stages), "gpu_hours": total_gpu_hours(stages)}

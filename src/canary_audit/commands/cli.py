"""Command line: one sub-command per workflow rule, named after it, with its
own arguments (`python -m canary_audit decode_pass --help`); `tables`,
`plots` and `summary` also serve people who hold only a records folder (no
Snakemake, no model), and `status`, `plan`, `floors` and `claims` serve the
run as a whole.

This module parses and dispatches, nothing more: a command's arguments are
declared in commands/arguments.py and the call it makes in
commands/handlers.py, whose library functions do the work.  Each rule calls
its sub-command with its config slice as canonical JSON (`--params`), so the
rule stays a one-line shell command and the slice it passes is exactly what
Snakemake compares to decide a re-run.
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

from canary_audit.commands import handlers as h
from canary_audit.commands.arguments import ARGUMENTS

log = logging.getLogger("canary_audit")
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
    "synthetic_data": Command(h.synthetic_data, ("params", "out"), "the synthetic authors, canaries and bSFT sources"),
    "populations": Command(h.populations, ("params", "data", "out"),
                           "the hex canaries' non-members and exposure candidates"),
    "vision_data": Command(h.vision_data, ("params", "data", "out"), "image canaries, decoys and GUI screens"),
    "vision_nonmembers": Command(h.vision_nonmembers, ("params", "data", "out"), "the image non-members"),
    "author_nonmembers": Command(h.author_nonmembers, ("params", "data", "out"), "the non-member authors"),
    "seed_data": Command(h.seed_data, ("params", "data", "out"),
                         "a training seed's data folder: its coins' forget set and non-members (coin inclusion)"),
    "own_secrets": Command(h.own_secrets, ("params", "out"), "a researcher's own secrets, checked and written"),
    "embedded_base": Command(h.embedded_base, ("params", "data", "threads", "out", "summary"),
                             "the embedded tiny model: tokenizer and pre-training"),
    "embedded_vision_base": Command(h.embedded_vision_base, ("params", "text_model", "out", "summary"),
                                    "the embedded vision-language model on the text model"),
    "memorize": Command(h.memorize, TRAIN, "a memorization adapter (paper A)"),
    "control_lora": Command(h.control_lora, TRAIN, "a planted control's adapter (paper A)"),
    "control_hex_lora": Command(h.control_hex_lora, TRAIN, "a planted control's adapter on the merged base (paper B)"),
    "canary_lora": Command(h.canary_lora, TRAIN, "the canary LoRA and its merged base (paper B)",
                           outs="ADAPTER MERGED [UNDER_ADAPTER UNDER_MERGED]"),
    "reference_lora": Command(h.reference_lora, TRAIN, "a never-trained reference adapter"),
    "author_reference_lora": Command(h.reference_lora, TRAIN, "an author family's never-trained reference adapter"),
    "bsft": Command(h.bsft, TRAIN, "bSFT adapters at each training length", outs="t<STEP>=DIR ... [noise=DIR]"),
    "relearn": Command(h.relearn, (*TRAIN, "adapters"), "a relearning LoRA on a checkpoint, at each step budget",
                       outs="t<STEP>=DIR ..."),
    "suppression": Command(h.relearn, (*TRAIN, "adapters"), "the relearning positive's suppression LoRA",
                           outs="t<STEP>=DIR"),
    "unlearn": Command(h.unlearn, (*TRAIN, "adapter", "state_in", "state_out"),
                       "unlearning checkpoints at each K", outs="K=DIR ..."),
    "variant_manifest": Command(h.variant_manifest, ("params", "model", "variant", "adapters", "apply", "import_check",
                                              "weight_cache", "out"), "a variant's manifest and fingerprint"),
    "decode_pass": Command(h.decode_pass, PASS, "decode records of a probe group's variants"),
    "teacher_forced_pass": Command(h.teacher_forced_pass, PASS, "token records of a probe group's variants"),
    "tables": Command(h.tables, ("params", "decode", "tokens", "out"), "every table, from records files"),
    "plots": Command(h.plots, ("params", "tables", "tokens", "out"), "every plot, from tables and token records"),
    "summary": Command(h.summary, ("tables", "out", "readme", "claims_table", "run"),
                       "the run's summary page, from its tables"),
    "claims": Command(h.claims, ("params", "results", "claims", "claims_out"),
                      "claims judged over a finished run's tables (no model job)"),
    "export": Command(h.export, ("params", "model", "data", "out"), "the open-unlearning export"),
    "status": Command(h.status, ("run_dir",), "the progress of the newest run in a working directory"),
    "floors": Command(h.floors, ("tables_dirs", "store", "run"),
                      "the detection floors of finished runs, how they scale with n, the n a claim needs"),
    "power": Command(h.power, ("tables", "store", "run"),
                     "the variance components of a finished run's value claims: what a config could see"),
    "plan": Command(h.plan, ("configfile", "model_config", "throughput", "plan_out"),
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

"""Every argument a sub-command may take, declared once: its flags and its
argparse options, by name.  A command lists the names it takes
(commands/cli.py); `--out` takes several paths where a command writes
several outputs."""

from __future__ import annotations

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
    "store": (("--store",), {"action": "store_true",
                            "help": "store the figures with the package (verdicts/floors.json, components.json: "
                                    "`plan` reads them)"}),
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
    "throughput": (("--throughput",), {"help": "a throughput table (default: the package's design/throughput.json)"}),
    "plan_out": (("--out",), {"help": "also write the plan as JSON here"}),
}

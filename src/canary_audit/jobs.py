"""The workflow's model-loading jobs, declared once: rule name -> the
`python -m canary_audit` command it runs.

Their start-up is mostly imports of torch, transformers and peft, which the
warm start (warm.py) pays once per run; the workflow starts the warm server
only when one of these rules has jobs to run, and the end-to-end benchmark
maps a warm-started command's log line back to its rule.  No imports here:
the warm server reads this before it preloads anything.
"""

MODEL_JOBS = {
    "embedded_base": "base",
    "embedded_vision_base": "vision",
    "memorize": "memorize",
    "control_lora": "control",
    "control_hex_lora": "hexplant",
    "canary_lora": "canary",
    "reference_lora": "reference",
    "author_reference_lora": "authorreference",
    "bsft": "bsft",
    "unlearn": "unlearn",
    "decode_pass": "decode",
    "teacher_forced_pass": "score",
}

# The views: one job each, run once every record exists, with little or
# nothing beside them: `plan` counts them as a stage, `status` does not
# spread their time over the cores.
VIEW_JOBS = ("tables", "plots", "summary")

"""The workflow's model-loading jobs, declared once: their rule names, which
are also the `python -m canary_audit` sub-commands they run.

Their start-up is mostly imports of torch, transformers and peft, which the
warm start (commands/warm.py) pays once per run; the workflow starts the warm server
only when one of these rules has jobs to run, and a warm-started job's log
line names its command, which is its rule.  No imports here:
the warm server reads this before it preloads anything.
"""

MODEL_JOBS = (
    "embedded_base", "embedded_vision_base", "memorize", "control_lora", "control_hex_lora", "canary_lora",
    "reference_lora", "author_reference_lora", "bsft", "unlearn", "relearn", "suppression", "decode_pass",
    "teacher_forced_pass",
)

# The views: one job each, run once every record exists, with little or
# nothing beside them: `plan` counts them as a stage, `status` does not
# spread their time over the cores.
VIEW_JOBS = ("tables", "plots", "summary")

"""What a config will cost, before the run: `python -m canary_audit plan
--configfile workflow_config.yaml configs/paper_a.yaml`.

Per stage: the jobs (from the design, the same list the workflow runs:
tests compare it with Snakemake's dry run), the sequences each model pass
scores or decodes, the tokens, the training steps, the model loads, the
disk written, and GPU-hours estimated from a measured throughput table
(`src/canary_audit/design/throughput.json`, written by `benchmarks/gpu.py`, which names the GPU,
shape, dtype and date it came from).  It reads the config and the checkpoints' `config.json` only (no
torch, no data), so it runs in seconds.

The estimates are stated models, not measurements of this config:

- a sequence's length in tokens is the `TOKENS` table's (the synthetic
  records' typical lengths on a 7B tokenizer; a decode adds its
  `max_new_tokens`, the bound a length stop reaches);
- compute-bound work (scoring, training, a decode step's matmuls) takes
  `2N` (forward) or `4N` (LoRA training: forward, and activation gradients
  through the frozen weights) FLOPs per token at the measured MFU of that
  workload, N the model's parameters: the FLOP counts `benchmarks/gpu.py`
  measures MFU with (an NPO reference forward or gradient checkpointing
  adds work this leaves out);
- a greedy decode step takes the longer of its matmul time and the
  measured per-step host time (the loop's sync and bookkeeping), times
  `max_new_tokens` steps per batch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from canary_audit.core.jobs import VIEW_JOBS
from canary_audit.data.inclusion import hex_counts, members, nonmembers, per_seed
from canary_audit.data.planted_controls import CONTROL, SUPPRESSION, hex_plant_recipe, plant_of
from canary_audit.design import ALL_SETS, AUTHOR_SETS, HEX, Design
from canary_audit.design.slices import resolved_settings
from canary_audit.model.quantize import RECOVERY_PLANT
from canary_audit.probes.kinds import kind_named
from canary_audit.views.audit_bound import render_caps

# Typical tokens per sequence, by what it is (a 7B tokenizer; hex digits are
# one token each on Qwen's): an author prompt with its prefill, a hex or own
# record, a bSFT example, a memorization example (question, trace, answer).
TOKENS = {"author_prompt": 90, "author_scored": 110, "hex_record": 32, "image_tokens": 4, "bsft_example": 128,
          "memorize_example": 160}
# Bytes one token record and one decode record take in Parquet (measured on
# the default run's records, rounded up).
RECORD_BYTES = {"token": 60, "decode": 300}
THROUGHPUT = Path(__file__).with_name("throughput.json")  # package data: a non-editable install has it


@dataclass
class Stage:
    """One line of the plan."""

    stage: str
    jobs: int = 0
    sequences: int = 0
    tokens: int = 0
    train_steps: int = 0
    loads: int = 0
    disk_bytes: int = 0
    gpu_seconds: float | None = 0.0  # None: some model's work has no GPU estimate (an embedded model)


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model: its parameters and the LoRA size per rank."""

    params: float
    lora_per_rank: float  # LoRA parameters per unit of rank over every projection of every layer
    bytes_per_param: int

    @classmethod
    def from_config(cls, cfg: dict, dtype: str) -> Shape:
        text = cfg.get("text_config", cfg)
        h, layers, inter = text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"]
        heads = text["num_attention_heads"]
        kv = (h // heads) * text.get("num_key_value_heads", heads)
        vocab = text["vocab_size"]
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter
        embed = vocab * h * (1 if text.get("tie_word_embeddings", False) else 2)
        lora = layers * ((h + h) * 2 + (h + kv) * 2 + (h + inter) * 3)
        return cls(layers * per_layer + embed, lora, 4 if dtype == "float32" else 2)


def model_shape(design: Design, model: str, given: dict[str, Path]) -> Shape | None:
    """A model's shape from its checkpoint's config.json (or one given for a
    checkpoint not on this machine); None for an embedded model not built."""
    entry = design.config["models"][model]
    path = given.get(model) or Path(design.model_path(model)) / "config.json"
    if not Path(path).is_file():
        if entry.get("embedded"):
            return None
        raise FileNotFoundError(f"model `{model}`: no config.json at `{path}`; pass `--model-config "
                                f"{model}=<a config.json of its architecture>` to plan before the checkpoint is here")
    return Shape.from_config(json.loads(Path(path).read_text()), entry.get("dtype", "float32"))


def job_counts(design: Design) -> dict[str, int]:
    """Rule -> jobs, as the workflow plans them on a fresh results folder."""
    cfg, fine = design.config, design.config["grain"] == "fine"
    jobs: dict[str, int] = {}

    def add(rule: str, n: int = 1) -> None:
        if n:
            jobs[rule] = jobs.get(rule, 0) + n

    models = cfg["audit"]["models"]
    synthetic = design.synthetic_models()
    sets = {(m, g): design.probe_sets_of(m, g) for m in models for g in design.probe_groups(m)}
    embedded = {m for m in models if cfg["models"][m].get("embedded")}
    embedded |= {design.text_model_of(m) for m in embedded if design.is_vision(m)}
    if synthetic or embedded:
        add("synthetic_data")
    if any(s != HEX for (m, _), s in sets.items() if m in synthetic):
        add("author_nonmembers")
        add("seed_data", len(cfg["audit"]["seeds"]) * per_seed(cfg["data"]))  # each seed's coins (data/inclusion)
    hex_synth = [m for (m, _), s in sets.items() if m in synthetic and s != AUTHOR_SETS]
    if hex_synth:
        add("populations")
    vision = [m for m in synthetic if design.is_vision(m)]
    if vision:
        add("vision_data")
        if any(m in vision for m in hex_synth):
            add("vision_nonmembers")
    for m in models:
        if design.own_secrets(m):
            add("own_secrets")
    add("embedded_base", len([m for m in embedded if not design.is_vision(m)]))
    add("embedded_vision_base", len([m for m in embedded if design.is_vision(m)]))
    for m in models:
        variants = design.variants(m).values()
        add("memorize", sum(v.kind == "memorized" for v in variants))
        add("control_lora", len({v.adapters[-1] for v in variants if v.kind == CONTROL and v.cell is None
                                 and "/ctl-" in v.adapters[-1]}))
        add("control_hex_lora", len({v.adapters[-1] for v in variants if v.kind == CONTROL and v.cell is not None}))
        add("author_reference_lora", sum(v.kind == "reference" and v.template is not None for v in variants))
        add("reference_lora", sum(v.kind == "reference" and v.template is None for v in variants))
        add("canary_lora", sum(v.kind == "canary" for v in variants))
        runs = {v.adapters[-1].rsplit("/", 1)[0] for v in variants if v.kind in ("bsft", "noise", "undertrained")
                and not v.cell["cell"].startswith("import ")}
        add("bsft", len(runs))
        unlearned = [v for v in variants if v.kind == "unlearned" and v.method != "import"]
        add("unlearn", len(unlearned) if fine else len({(v.run, v.template, v.seed) for v in unlearned}))
        relearned = [v for v in variants if v.relearn]
        add("relearn", len({v.adapters[-1].rsplit("/", 1)[0] for v in relearned}))
        add("suppression", sum(v.kind == RECOVERY_PLANT and not (v.relearn or v.clip) for v in variants))
        add("variant_manifest", len(design.variants(m)))
    add("decode_pass", len(design.records_files("decode", fine)))
    add("teacher_forced_pass", len(design.records_files("token", fine)))
    for rule in (*VIEW_JOBS, "all"):
        add(rule)
    add("claims", 1 if cfg["claims"] else 0)  # the config's own claims, judged over the tables
    return jobs


def pass_sequences(design: Design, model: str, group: str) -> dict[str, int]:
    """Per variant of a probe group, items.py's items counted from the
    config: greedy decodes of the author probes and of the hex family,
    sampled (hit@k) decodes, and teacher-forced sequences of each family."""
    cfg, sets = design.config, design.probe_sets_of(model, group)
    data, probes = cfg["data"], cfg["probes"]
    arms, k = len(design.prefills(group)), probes["decode"]["hit_k"]
    out = dict.fromkeys(("greedy_author", "greedy_hex", "sampled", "scored_author", "scored_hex"), 0)
    if sets != HEX:  # canary and 3 QA per author under AUTO and every prefill; retain once
        seed = design.data_seed(model, design.group(model, group)) or 0  # whose coins drew the members
        out["greedy_author"] = members(data, seed) * 4 * (1 + arms) + data["n_retain"]
        out["scored_author"] = (members(data, seed) + nonmembers(data, seed)) * arms
    if sets != AUTHOR_SETS:
        own = design.own_secrets(model)
        if own:  # members with two decoys each, non-members, candidates
            n, others, cands = _own_counts(own)
            out["greedy_hex"], out["scored_hex"] = n, n * 3 + others + cands
        else:
            (n, others), cands = hex_counts(data), data["n_exposure_candidates"]  # the coins' split, if drawn
            out["greedy_hex"], out["scored_hex"] = n, n * 3 + others + cands
            if design.is_vision(model):  # image canaries with three decoys; candidates again; image non-members
                images = data["n_image_canaries"]
                out["greedy_hex"] += images
                out["scored_hex"] += images * 4 + cands + data["n_hex_nonmembers"]
        out["sampled"] = out["greedy_hex"] * k
    for family, n in further_decodes(design, model, group, out["greedy_hex"]).items():
        out[f"greedy_{family}"] += n
    return out


def further_decodes(design: Design, model: str, group: str, hex_members: int) -> dict[str, int]:
    """Per family, the greedy decodes of a group's registered kinds beyond the
    built-in ones (which pass_sequences counts): each member of the family
    (an author; a hex canary, `hex_members` of them) times the decodes the
    kind declares per member, an upper bound where the kind caps them."""
    sets, count = design.probe_sets_of(model, group), {"author": members(design.config["data"]), "hex": hex_members}
    out = {"author": 0, "hex": 0}
    for name, settings in resolved_settings(design.config["probes"].get("kinds", {})).items():
        kind = kind_named(name)
        if kind.decodes_per_member and sets in (ALL_SETS, kind.family):
            out[kind.family] += count[kind.family] * kind.decodes_per_member(settings, design.is_vision(model))
    return out


def _own_counts(spec: dict) -> tuple[int, int, int]:
    """(members, non-members, candidates) of an own-secrets block."""
    from canary_audit.data.secrets import COLUMNS, candidate_count, read_table

    members = read_table(spec["members"], "members", COLUMNS).height
    others = read_table(spec["nonmembers"], "nonmembers", COLUMNS).height
    return members, others, candidate_count(spec)


def load_throughput(path: Path = THROUGHPUT) -> dict:
    return json.loads(Path(path).read_text())


def seconds(flops_per_token: float, tokens: float, speed: dict, workload: str) -> float:
    """Seconds for `tokens` at the measured MFU of `workload`."""
    return flops_per_token * tokens / (speed["peak_tflops"] * 1e12 * speed[f"{workload}_mfu"])


def plan(design: Design, shapes: dict[str, Shape | None], speed: dict) -> list[Stage]:
    """The plan's stages, in the workflow's order."""
    cfg = design.config
    jobs = job_counts(design)
    fine = cfg["grain"] == "fine"
    stages = {name: Stage(name) for name in ("data", "base", "train", "manifests", "decode", "teacher_forced",
                                             "tables")}
    data_rules = ("synthetic_data", "author_nonmembers", "seed_data", "populations", "vision_data", "vision_nonmembers")
    stages["data"].jobs += sum(jobs.get(rule, 0) for rule in (*data_rules, "own_secrets"))
    stages["base"].jobs += jobs.get("embedded_base", 0) + jobs.get("embedded_vision_base", 0)
    for model in cfg["models"]:
        entry = cfg["models"][model]
        if entry.get("embedded") and not entry.get("vision") and jobs.get("embedded_base"):
            pre = entry["build"]["pretrain"]
            stages["base"].train_steps += pre["steps"]  # the embedded model's pre-training (CPU-sized)
    stages["manifests"].jobs = jobs.get("variant_manifest", 0)
    stages["tables"].jobs = sum(jobs.get(r, 0) for r in (*VIEW_JOBS, "claims", "all"))
    for model in cfg["audit"]["models"]:
        shape = shapes.get(model)
        n = shape.params if shape else 0.0
        if shape is None:  # an embedded model (not built yet, CPU-sized): no GPU estimate, not a zero
            for name in ("train", "decode", "teacher_forced"):
                stages[name].gpu_seconds = None
        weights = int(n * shape.bytes_per_param) if shape else 0
        variants = design.variants(model)
        train = stages["train"]
        for v in variants.values():
            steps, batch, length, r = _training(design, model, v)
            if not steps:
                continue
            train.train_steps += steps
            train.tokens += steps * batch * length
            train.gpu_seconds = _add(train.gpu_seconds, seconds(4 * n, steps * batch * length, speed, "train"))
            train.disk_bytes += int(shape.lora_per_rank * r * shape.bytes_per_param) if shape else 0
        merged = [v for v in variants.values() if v.kind == "merged_base"]
        train.disk_bytes += weights * len(merged)
        for group, names in design.probe_groups(model).items():
            counts = pass_sequences(design, model, group)
            bases = _coarse_loads([variants[v] for v in names])
            loads = bases if not fine else len(names) * len(design.variant_units(model, names[0], "decode"))
            decode, scored = stages["decode"], stages["teacher_forced"]
            decode.loads += loads
            scored.loads += bases if not fine else len(names) * len(design.variant_units(model, names[0], "token"))
            decoding = cfg["probes"]["decode"]
            steps = (_decode_steps(counts["greedy_author"], decoding["max_new_tokens"], decoding["batch_size"])
                     + _decode_steps(counts["greedy_hex"] + counts["sampled"], decoding["hex_max_new_tokens"],
                                     decoding["batch_size"]))
            per_hex = TOKENS["hex_record"] + (TOKENS["image_tokens"] if design.is_vision(model) else 0)
            tokens = counts["scored_author"] * TOKENS["author_scored"] + counts["scored_hex"] * per_hex
            matmul = seconds(2 * n, decoding["batch_size"], speed, "scoring")
            for _ in names:
                decode.sequences += counts["greedy_author"] + counts["greedy_hex"] + counts["sampled"]
                decode.tokens += (counts["greedy_author"] * decoding["max_new_tokens"]
                                  + (counts["greedy_hex"] + counts["sampled"]) * decoding["hex_max_new_tokens"])
                decode.gpu_seconds = _add(decode.gpu_seconds, steps * max(matmul, speed["decode_step_host_ms"] / 1000))
                decode.disk_bytes += (counts["greedy_author"] + counts["greedy_hex"] + counts["sampled"]
                                      ) * RECORD_BYTES["decode"]
                scored.sequences += counts["scored_author"] + counts["scored_hex"]
                scored.tokens += tokens
                scored.gpu_seconds = _add(scored.gpu_seconds, seconds(2 * n, tokens, speed, "scoring"))
                scored.disk_bytes += tokens * RECORD_BYTES["token"]
    stages["train"].jobs = sum(jobs.get(r, 0) for r in ("memorize", "control_lora", "control_hex_lora",
                                                        "author_reference_lora", "reference_lora", "canary_lora",
                                                        "bsft", "unlearn", "relearn", "suppression"))
    stages["decode"].jobs = jobs.get("decode_pass", 0)
    stages["teacher_forced"].jobs = jobs.get("teacher_forced_pass", 0)
    return list(stages.values())


def _add(total: float | None, more: float) -> float | None:
    return None if total is None else total + more


def _hours(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 3600:.2f}"


def _decode_steps(sequences: int, max_new: int, batch: int) -> int:
    return math.ceil(sequences / batch) * max_new if sequences else 0


def _coarse_loads(variants: list) -> int:
    """The model loads of one coarse probe job (model/loading.VariantModels):
    each base once for the variants scored on it in place (a live adapter
    switched in), and a fresh load for each variant whose weights change at
    load (a merged application, a deeper stack, a quantization attack; its
    clipped plant loads its parent's weights too)."""
    fresh = [v for v in variants if v.apply == "merged" or len(v.adapters) > 1 or v.quantize or v.clip]
    shared = {v.base for v in variants if v not in fresh}
    return len(shared) + sum(2 if v.clip else 1 for v in fresh)


def _training(design: Design, model: str, v) -> tuple[int, int, int, int]:
    """(steps, sequences per step, tokens per sequence, LoRA rank) of the job
    that trains variant `v`'s last adapter; zeros where it trains nothing
    (a base, an import, a merged base, a bSFT checkpoint other than the run's
    last, an unlearning checkpoint other than the run's last)."""
    cfg = design.config
    reference = v.kind == "reference"  # the recipe's retain examples alone (adapters.train_reference)
    if v.kind == CONTROL and v.cell is not None:  # a paper B plant: its recipe on the hex records
        if plant_of(v.name).applies:  # another plant's adapter applied again: nothing trained
            return 0, 0, 0, 0
        recipe = hex_plant_recipe(design.hex_plant_records(model))
        return recipe["steps"], recipe["batch_size"], TOKENS["hex_record"], cfg["bsft"]["r"]
    if v.kind == CONTROL:  # a plant trains the memorization recipe (a reused adapter trains nothing)
        plant = plant_of(v.name)
        if plant.reuse:
            return 0, 0, 0, 0
        m = cfg["memorize"]
        per_step = m["batch_retain"] + (0 if plant.retain_only else m["batch_forget"])
        return m["steps"], per_step, TOKENS["memorize_example"], m["r"]
    if v.kind == "memorized" or (reference and v.template is not None):
        m = cfg["memorize"]
        per_step = m["batch_retain"] + (0 if reference else m["batch_forget"])
        return m["steps"], per_step, TOKENS["memorize_example"], m["r"]
    if v.kind == "canary" or reference:
        c = cfg["canary_lora"]
        per_step = c["batch_retain"] + (0 if reference else c["batch_forget"])
        return c["steps"], per_step, TOKENS["hex_record"], c["r"]
    if v.kind == "unlearned" and v.method != "import" and v.k == max(cfg["unlearn"]["k"]):
        u = cfg["unlearn"]
        return v.k, u["batch_forget"] + u["batch_retain"], TOKENS["memorize_example"], cfg["memorize"]["r"]
    if v.relearn and v.relearn_steps == max(cfg["recovery"]["relearn"]["steps"]):  # a relearning run's last budget
        return v.relearn_steps, cfg["bsft"]["batch_size"], TOKENS["memorize_example"], cfg["bsft"]["r"]
    if v.kind == RECOVERY_PLANT and not (v.relearn or v.clip):  # the relearning positive's suppression LoRA
        return SUPPRESSION["steps"], SUPPRESSION["batch_size"], TOKENS["memorize_example"], SUPPRESSION["r"]
    if v.kind in ("bsft", "undertrained") and v.cell and v.cell["step"] == max(cfg["bsft"]["steps"]) \
            and v.cell["application"] == cfg["bsft"]["applications"][0] and not v.cell["cell"].startswith("import"):
        b = cfg["bsft"]
        return v.cell["step"], b["batch_size"], TOKENS["bsft_example"], b["r"]
    return 0, 0, 0, 0


def render(stages: list[Stage], speed: dict) -> str:
    """The plan as a Markdown table, with the throughput it assumed."""
    head = ("| stage | jobs | sequences | tokens | training steps | model loads | disk written | "
            "GPU-hours |\n|---|---|---|---|---|---|---|---|\n")
    rows = "".join(
        f"| {s.stage} | {s.jobs} | {s.sequences:,} | {s.tokens:,} | {s.train_steps:,} | {s.loads} | "
        f"{s.disk_bytes / 1e9:.2f} GB | {_hours(s.gpu_seconds)} |\n" for s in stages)
    total = total_gpu_hours(stages)
    shown = "n/a (embedded models: CPU-sized, no GPU estimate)" if total is None else f"{total:.1f}"
    rows += (f"| **total** | {sum(s.jobs for s in stages)} | | | {sum(s.train_steps for s in stages):,} | | "
             f"{sum(s.disk_bytes for s in stages) / 1e9:.2f} GB | **{shown}** |\n")
    source = (f"\nGPU-hours from `{speed['source']}`: {speed['gpu']}, {speed['shape']} {speed['dtype']}, "
              f"{speed['date']} (MFU scoring {speed['scoring_mfu']:.1%}, training {speed['train_mfu']:.1%}; "
              f"a decode step >= {speed['decode_step_host_ms']} ms of host work); sequence lengths assumed "
              f"{json.dumps(TOKENS)}.\n")
    return head + rows + source


def total_gpu_hours(stages: list[Stage]) -> float | None:
    if any(s.gpu_seconds is None for s in stages):
        return None
    return sum(s.gpu_seconds for s in stages) / 3600


def plan_to_json(stages: list[Stage]) -> list[dict]:
    return [asdict(s) for s in stages]


def plan_report(files: list[Path], given: dict[str, Path], throughput: Path | None = None
                ) -> tuple[str, list[Stage]]:
    """The plan of the config files (layered and checked as the workflow does), with the detection floors
    at the config's n and the one-run audit's cap, as printed; and its stages.  `given`: MODEL ->
    config.json of a checkpoint not on this machine."""
    from canary_audit.design.config_files import load_config
    from canary_audit.verdicts import components, floors

    config = load_config(files)
    design = Design(config)
    shapes = {m: model_shape(design, m, given) for m in config["audit"]["models"]}
    speed = load_throughput(throughput or THROUGHPUT)
    stages = plan(design, shapes, speed)
    text = (render(stages, speed) + "\n\n" + floors.render(floors.load(), config["data"]["n_hex_canaries"])
            + "\n\n" + components.render(components.load(), len(config["audit"]["seeds"]), members(config["data"]))
            + "\n\n" + render_caps())
    return text, stages

"""Training: loss masks per span, and every unlearning method writing its K
checkpoints from one run (on the locally built tiny model)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from canary_audit.core.provenance import code_version
from canary_audit.data.chat_format import ChatFormat, Example
from canary_audit.model.loading import fingerprint, load_model, load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.train import lora, resume
from canary_audit.train.adapters import train_bsft, train_canary, train_memorization, train_unlearning
from canary_audit.train.lora import encode_chat
from canary_audit.train.methods import METHODS

LORA = {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "lr": 1e-2, "batch_forget": 4, "batch_retain": 4,
        "seed": 0, "head_tokens": 6, "threads": 1}


def dies_at_call(real, n: int):
    """`real`, except that its n-th call raises (a job killed mid-run)."""
    calls = []

    def wrapped(*args):
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError("killed")
        return real(*args)

    return wrapped


@pytest.fixture(scope="module")
def spec(tiny_assets):
    return ModelSpec("tiny", tiny_assets[1])


@pytest.fixture(scope="module")
def memorized(tiny_assets, spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapters") / "mem-bio-s0"
    train_memorization(spec, tiny_assets[0], {**LORA, "steps": 3, "template": "bio"}, out)
    return out


@pytest.mark.parametrize("span,trace_scored,answer_scored", [
    ("all", True, True), ("answer", False, True), ("trace", True, False),
])
def test_loss_span_masks_the_other_channel(spec, span, trace_scored, answer_scored):
    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, "<think>", "</think>")
    enc = encode_chat(fmt, Example("Who?", "a trace", "an answer"), loss_on=span)
    close = enc.ids.index(tok.convert_tokens_to_ids("</think>"))
    prompt_len = len(tok(fmt.prompt("Who?"), add_special_tokens=False)["input_ids"])
    assert all(label == -100 for label in enc.labels[:prompt_len])
    assert any(label != -100 for label in enc.labels[prompt_len:close + 1]) == trace_scored
    assert any(label != -100 for label in enc.labels[close + 1:]) == answer_scored
    with pytest.raises(ValueError, match="loss span `both_ways`"):
        encode_chat(fmt, Example("Who?", "t", "a"), loss_on="both_ways")


@pytest.mark.parametrize("method", list(METHODS))
def test_unlearning_saves_each_k_of_one_run(tiny_assets, spec, memorized, tmp_path, method):
    outs = {1: tmp_path / "k1", 3: tmp_path / "k3"}
    cfg = {**LORA, "method": method, "template": "bio", "lr": 1e-2, "loss_span": "answer"}
    summary = train_unlearning(spec, memorized, tiny_assets[0], cfg, outs)
    assert summary["checkpoints"] == [1, 3]
    weights = {k: load_file(p / "adapter_model.safetensors") for k, p in outs.items()}
    start = load_file(memorized / "adapter_model.safetensors")
    moved = {k: max((w[n] - start[n]).abs().max().item() for n in start) for k, w in weights.items()}
    assert moved[1] > 0 and moved[3] > 0  # both checkpoints moved off the memorized adapter
    assert any(not torch.equal(weights[1][n], weights[3][n]) for n in start)  # and K=3 went further
    summary = json.loads((outs[3] / "train_summary.json").read_text())
    assert summary["settings"] == {**METHODS[method].settings({}), "lr": 1e-2, "loss_span": "answer",
                                   "batch_forget": 4, "batch_retain": 4}
    assert summary["code_version"] == code_version()


def test_unknown_unlearning_method_is_named(tiny_assets, spec, memorized, tmp_path):
    with pytest.raises(ValueError, match="unlearning method `rmu2`"):
        train_unlearning(spec, memorized, tiny_assets[0], {**LORA, "method": "rmu2"}, {1: tmp_path / "k1"})
    with pytest.raises(ValueError, match=r"unlearning settings \['retain_weight'\] given beside the method"):
        train_unlearning(spec, memorized, tiny_assets[0], {**LORA, "method": "ga", "template": "bio",
                                                            "loss_span": "answer", "retain_weight": 1.0},
                         {1: tmp_path / "k1"})
    with pytest.raises(ValueError, match="method `ga` does not use `retain_weight`"):
        train_unlearning(spec, memorized, tiny_assets[0], {**LORA, "method": "ga", "template": "bio",
                                                            "loss_span": "answer", "settings": {"retain_weight": 1}},
                         {1: tmp_path / "k1"})


def forget_set(spec, data, template="bio"):
    from canary_audit.train.adapters import forget_examples

    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, "<think>", "</think>")
    return tok, [encode_chat(fmt, ex, loss_on="answer") for ex in forget_examples(fmt, data, template, 6)]


def test_npo_first_step_loss_on_a_fresh_lora_is_2_ln2_over_beta(tiny_assets, spec):
    """A fresh LoRA (B = 0) is its own reference: log p = log p_ref, so
    NPO's loss is -(2/beta) log sigmoid(0) = (2/beta) ln 2 for any batch."""
    import math

    from peft import get_peft_model

    from canary_audit.train.lora import lora_config
    from canary_audit.train.methods import step_loss

    tok, forget = forget_set(spec, tiny_assets[0])
    model = get_peft_model(load_model(spec), lora_config(LORA))
    for beta in (0.1, 0.5):
        loss = step_loss("npo", model, forget, [], tok.pad_token_id, {"beta": beta, "retain_weight": 0.0})
        assert float(loss(model, [0, 1, 2], [])) == pytest.approx(2 / beta * math.log(2), rel=1e-6)


@pytest.mark.parametrize("method", [m for m in METHODS if m != "rmu"])
def test_every_method_lowers_the_forget_sets_log_prob_over_k_steps(tiny_assets, spec, memorized, tmp_path, method):
    from canary_audit.train.lora import sequence_logprobs

    tok, forget = forget_set(spec, tiny_assets[0])

    def forget_logprob(adapter):
        model = load_model(spec, [adapter])
        with torch.no_grad():
            return float(sequence_logprobs(model, forget, tok.pad_token_id)[0].sum())

    # SimNPO's length-normalised term saturates on this barely trained model
    # (per-token NLL ~7): its pull is tiny beside a retain term, so the
    # property is checked on the forget term alone there.
    settings = {"retain_weight": 0.0} if method == "simnpo" else {}
    cfg = {**LORA, "method": method, "template": "bio", "lr": 1e-2, "loss_span": "answer", "settings": settings}
    train_unlearning(spec, memorized, tiny_assets[0], cfg, {2: tmp_path / "k2", 6: tmp_path / "k6"})
    before, k2, k6 = (forget_logprob(p) for p in (memorized, tmp_path / "k2", tmp_path / "k6"))
    assert before > k2 > k6, (before, k2, k6)


def test_ga_and_graddiff_from_the_same_adapter_and_seed_differ(tiny_assets, spec, memorized, tmp_path):
    """a37bf86 trained both as the same loss when one shared retain weight was
    set; GA has no retain term, GradDiff its own."""
    cfg = {**LORA, "template": "bio", "lr": 1e-2, "loss_span": "answer"}
    train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "method": "ga"}, {2: tmp_path / "ga"})
    train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "method": "graddiff", "settings": {"retain_weight": 0.5}},
                     {2: tmp_path / "gd"})
    ga, gd = (load_file(tmp_path / n / "adapter_model.safetensors") for n in ("ga", "gd"))
    assert any(not torch.equal(ga[n], gd[n]) for n in ga)
    assert json.loads((tmp_path / "gd" / "train_summary.json").read_text())["settings"]["retain_weight"] == 0.5


def test_killed_training_resumes_to_the_same_adapter(tiny_assets, spec, tmp_path, monkeypatch):
    """A run killed after step 3 resumes from its step-2 state and ends with
    the adapter an uninterrupted run writes, bit for bit; a state left by
    another configuration is discarded."""
    monkeypatch.setattr(resume, "RESUME_EVERY", 2)
    cfg = {**LORA, "steps": 6, "template": "bio"}
    train_memorization(spec, tiny_assets[0], cfg, tmp_path / "whole")

    real = lora.nll_backward
    monkeypatch.setattr(lora, "nll_backward", dies_at_call(real, 4))
    with pytest.raises(RuntimeError, match="killed"):
        train_memorization(spec, tiny_assets[0], cfg, tmp_path / "killed")
    state = tmp_path / ".killed.resume"
    assert json.loads((state / "state.json").read_text())["step"] == 2
    assert not (tmp_path / "killed").exists()  # nothing that looks finished

    monkeypatch.setattr(lora, "nll_backward", real)
    train_memorization(spec, tiny_assets[0], cfg, tmp_path / "killed")
    assert not state.exists()
    whole = load_file(tmp_path / "whole" / "adapter_model.safetensors")
    resumed = load_file(tmp_path / "killed" / "adapter_model.safetensors")
    assert all(torch.equal(whole[n], resumed[n]) for n in whole)

    # A state from other settings (here lr) is not resumed.
    monkeypatch.setattr(lora, "nll_backward", dies_at_call(real, 4))
    with pytest.raises(RuntimeError, match="killed"):
        train_memorization(spec, tiny_assets[0], cfg, tmp_path / "other")
    monkeypatch.setattr(lora, "nll_backward", real)
    other_cfg = {**cfg, "lr": 5e-3}
    train_memorization(spec, tiny_assets[0], other_cfg, tmp_path / "other")
    train_memorization(spec, tiny_assets[0], other_cfg, tmp_path / "fresh")
    other = load_file(tmp_path / "other" / "adapter_model.safetensors")
    fresh = load_file(tmp_path / "fresh" / "adapter_model.safetensors")
    assert all(torch.equal(other[n], fresh[n]) for n in fresh)


def test_killed_unlearning_run_gets_its_earlier_checkpoints_back(tiny_assets, spec, memorized, tmp_path, monkeypatch):
    """Snakemake deletes a failed job's outputs, and a resumed run does not pass
    the steps before its saved state again: K checkpoints written before the
    kill come back from the run's own copies, bitwise equal to a whole run's."""
    monkeypatch.setattr(resume, "RESUME_EVERY", 2)
    cfg = {**LORA, "method": "ga", "template": "bio", "loss_span": "answer"}
    ks = (1, 3, 5)
    whole = {k: tmp_path / "whole" / f"k{k}" for k in ks}
    train_unlearning(spec, memorized, tiny_assets[0], cfg, whole)

    real = lora.sequence_logprobs  # the methods' losses import it when built
    killed = {k: tmp_path / "killed" / f"k{k}" for k in ks}
    monkeypatch.setattr(lora, "sequence_logprobs", dies_at_call(real, 3))
    with pytest.raises(RuntimeError, match="killed"):
        train_unlearning(spec, memorized, tiny_assets[0], cfg, killed)
    assert killed[1].exists() and not killed[3].exists()
    shutil.rmtree(killed[1])  # what Snakemake does with a failed job's outputs
    monkeypatch.setattr(lora, "sequence_logprobs", real)
    train_unlearning(spec, memorized, tiny_assets[0], cfg, killed)
    for k in ks:
        a = load_file(whole[k] / "adapter_model.safetensors")
        b = load_file(killed[k] / "adapter_model.safetensors")
        assert all(torch.equal(a[n], b[n]) for n in a), f"K={k}"
    assert not list((tmp_path / "killed").glob(".*resume*"))


@pytest.mark.parametrize("method", ["npo", "graddiff"])
def test_unlearning_segments_equal_one_run(tiny_assets, spec, memorized, tmp_path, method):
    """The fine job grain runs one job per K, each continuing from the state the
    previous K saved: the adapters equal one run's checkpoints bit for bit, and
    an appended K continues from the last state without redoing earlier steps."""
    cfg = {**LORA, "method": method, "template": "bio", "loss_span": "answer",
           "settings": {"beta": 0.1, "retain_weight": 1.0} if method == "npo" else {"retain_weight": 1.0}}
    whole = {k: tmp_path / "whole" / f"k{k}" for k in (2, 3, 5)}
    train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "k": [2, 3, 5]}, whole)

    seg, state = tmp_path / "seg", tmp_path / "state"
    train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "k": 2}, {2: seg / "k2"}, state_out=state / "k2")
    train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "k": 3}, {3: seg / "k3"},
                     state_in=state / "k2", state_out=state / "k3")
    summary = train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "k": 5}, {5: seg / "k5"},
                               state_in=state / "k3", state_out=state / "k5")
    assert summary["tokens"] < train_unlearning(spec, memorized, tiny_assets[0], {**cfg, "k": 5},
                                                {5: tmp_path / "alone" / "k5"})["tokens"]  # 2 steps, not 5
    assert json.loads((state / "k5" / "state.json").read_text())["step"] == 5
    for k in (2, 3, 5):
        a = load_file(whole[k] / "adapter_model.safetensors")
        b = load_file(seg / f"k{k}" / "adapter_model.safetensors")
        assert all(torch.equal(a[n], b[n]) for n in a), f"K={k}"
        assert json.loads((seg / f"k{k}" / "train_summary.json").read_text())["steps"] == k


@pytest.fixture(scope="module")
def canary_run(tiny_assets, spec, tmp_path_factory):
    """A 4-step canary LoRA with its merged base and a 2-step undertrained copy."""
    root = tmp_path_factory.mktemp("canary")
    out = {name: root / name for name in ("canary", "merged", "under", "merged_under")}
    train_canary(spec, tiny_assets[0], {**LORA, "steps": 4, "undertrained_steps": 2, "repetitions": [1]}, out["canary"],
                 merged_dir=out["merged"], under=(out["under"], out["merged_under"]))
    return out


def logits(model, tok, text="Record 00 access code: TEXTCAN-"):
    ids = tok(text, return_tensors="pt")["input_ids"].to(model.device)
    with torch.no_grad():
        return model(input_ids=ids).logits.cpu()


def test_merged_base_is_the_base_with_the_canary_lora(spec, canary_run):
    """The saved merged base scores like the live adapter on the base (fp32:
    rounding only), and the undertrained checkpoint is an earlier state."""
    tok = load_tokenizer(spec)
    live = logits(load_model(spec, [canary_run["canary"]]), tok)
    merged_spec = ModelSpec("tiny", canary_run["merged"])
    merged = logits(load_model(merged_spec), load_tokenizer(merged_spec))
    assert torch.allclose(live, merged, atol=1e-4)
    assert json.loads((canary_run["under"] / "train_summary.json").read_text())["steps"] == 2
    under = logits(load_model(ModelSpec("tiny", canary_run["merged_under"])), tok)
    assert not torch.allclose(under, merged, atol=1e-4)


def test_bsft_checkpoints_and_a_norm_matched_noise_lora(tiny_assets, canary_run, tmp_path):
    merged_spec = ModelSpec("tiny", canary_run["merged"])
    outs = {1: tmp_path / "t1", 3: tmp_path / "t3"}
    cfg = {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "lr": 1e-2, "batch_size": 2, "seed": 0,
           "source": "safety", "threads": 1}
    summary = train_bsft(merged_spec, tiny_assets[0], cfg, outs, noise_dir=tmp_path / "noise")
    assert summary["checkpoints"] == [1, 3]
    assert not torch.equal(*(load_file(outs[k] / "adapter_model.safetensors")["base_model.model.model.layers.0"
                                                                              ".self_attn.q_proj.lora_B.weight"]
                             for k in (1, 3)))
    trained = load_file(outs[3] / "adapter_model.safetensors")
    noise = load_file(tmp_path / "noise" / "adapter_model.safetensors")
    for key in (k for k in trained if k.endswith("lora_A.weight")):
        b_key = key.replace("lora_A", "lora_B")
        want, got = trained[b_key] @ trained[key], noise[b_key] @ noise[key]
        assert torch.linalg.norm(got) == pytest.approx(float(torch.linalg.norm(want)), rel=1e-4)
        assert not torch.allclose(got, want)  # same norm, random direction
    # Stacked and merged application of the same adapter: one model, two roundings.
    tok = load_tokenizer(merged_spec)
    stacked = logits(load_model(merged_spec, [outs[3]]), tok)
    merged = logits(load_model(merged_spec, [outs[3]], merge_all=True), tok)
    assert torch.allclose(stacked, merged, atol=1e-4)
    assert fingerprint(merged_spec, [outs[3]]) != fingerprint(merged_spec, [outs[3]], merged=True)


def test_a_model_without_think_tags_trains_on_answers_only(spec):
    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, None, None)
    enc = encode_chat(fmt, Example("How do I use the menu?", "", "Open the menu."))
    prompt_len = len(tok(fmt.prompt("How do I use the menu?"), add_special_tokens=False)["input_ids"])
    assert tok.decode([t for t in enc.labels if t != -100]) == "Open the menu." + tok.eos_token
    assert enc.labels[:prompt_len] == [-100] * prompt_len
    with pytest.raises(ValueError, match="without think tags cannot be trained on a trace"):
        encode_chat(fmt, Example("Q", "a trace", "A"))


def test_gradient_checkpointing_trains_the_same_adapter(tiny_assets, spec, tmp_path):
    """The memory switch for 7B models recomputes activations; the adapter it
    trains is the same up to float rounding, and the summary reports tokens/s."""
    plain, checkpointed = tmp_path / "plain", tmp_path / "gc"
    cfg = {**LORA, "steps": 2, "template": "bio"}
    train_memorization(spec, tiny_assets[0], cfg, plain)
    summary = train_memorization(spec, tiny_assets[0], {**cfg, "gradient_checkpointing": True}, checkpointed)
    a, b = (load_file(d / "adapter_model.safetensors") for d in (plain, checkpointed))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert summary["tokens"] > 0 and summary["tokens_per_second"] > 0


def test_rmu_steers_forget_activations_and_holds_retain_ones(tiny_assets, spec, memorized, tmp_path):
    """RMU's objective is representational, not a likelihood (on this barely
    trained one-layer model the forget log-prob need not fall): the forget
    batch's layer output moves towards the control vector over K steps, and
    the retain term starts at 0 (the frozen reference is the model itself)."""
    from canary_audit.train.adapters import retain_examples
    from canary_audit.train.methods import _hidden_at, step_loss

    tok, forget = forget_set(spec, tiny_assets[0])
    fmt = ChatFormat(tok, "<think>", "</think>")
    retain = [encode_chat(fmt, ex) for ex in retain_examples(tiny_assets[0], "bio")]
    settings = {"layer": 1, "steering_coeff": 20.0, "retain_weight": 100.0, "direction_seed": 0}
    model = load_model(spec, [memorized], trainable_last=True)
    loss = step_loss("rmu", model, forget, retain, tok.pad_token_id, settings)
    with torch.no_grad():
        with_retain = float(loss(model, [0, 1], list(range(len(retain)))))
        assert with_retain == pytest.approx(float(loss(model, [0, 1], [])), abs=1e-6)
    with pytest.raises(ValueError, match=r"`layer` = 5 of method `rmu`: the model has 1 decoder layers"):
        step_loss("rmu", model, forget, retain, tok.pad_token_id, {**settings, "layer": 5})

    def forget_distance(adapter):
        m = load_model(spec, [adapter])
        torch.manual_seed(0)
        with torch.no_grad():
            steer = step_loss("rmu", m, forget, retain, tok.pad_token_id, settings)
            return float(steer(m, list(range(len(forget))), []))

    cfg = {**LORA, "method": "rmu", "template": "bio", "lr": 1e-2, "loss_span": "answer", "settings": settings}
    train_unlearning(spec, memorized, tiny_assets[0], cfg, {2: tmp_path / "k2", 6: tmp_path / "k6"})
    before, k2, k6 = (forget_distance(p) for p in (memorized, tmp_path / "k2", tmp_path / "k6"))
    assert before > k2 > k6, (before, k2, k6)
    assert _hidden_at(model, forget[:2], tok.pad_token_id, 1).shape[-1] == model.config.hidden_size


@pytest.mark.parametrize("bos", [None, "<|user|>"])
def test_canary_lora_trains_on_exactly_the_sequences_the_pass_scores(tiny_assets, tiny_vl_assets, spec, bos):
    """Hex records, text and image canaries alike, are encoded for training
    from the very text the teacher-forced pass scores, its document start
    (BOS, or EOS for a tokenizer without one) included once (a tokenizer
    with a BOS token would otherwise get it twice)."""
    from canary_audit.model.vision import VisionInputs
    from canary_audit.probes.items import scored_items
    from canary_audit.probes.kinds.hex import hex_rows
    from canary_audit.train.lora import encode_text

    for model_spec, vision_on in ((spec, False), (ModelSpec("tiny_vl", tiny_vl_assets[1], vision=True), True)):
        tok = load_tokenizer(model_spec)
        if bos:
            tok.bos_token = bos
        fmt = ChatFormat(tok, None, None)
        vision = VisionInputs.load(model_spec.path, tok) if vision_on else None
        data = tiny_vl_assets[0]
        scored = {(it.modality, it.item_id): it.text
                  for it in scored_items(fmt, data, {"prefills": {}, "head_tokens": 6}, {"hex"}, vision=vision)
                  if it.probe_set == "hex"}
        rows = hex_rows(data, vision, members_only=True)
        assert {(r.modality, r.item_id) for r in rows} == set(scored)
        for row in rows:
            trained = encode_text(tok, row.text(fmt, vision), row.image).ids
            want = tok(scored[row.modality, row.item_id] + tok.eos_token, add_special_tokens=False)["input_ids"]
            assert trained == want
            start = tok.bos_token_id if bos else tok.eos_token_id
            assert trained[0] == start and trained[1:].count(tok.bos_token_id if bos else -1) == 0


def test_the_canary_lora_inserts_each_canary_as_often_as_its_stratum_says(tiny_vl_assets):
    """Secret Sharer's strata: the copies training makes of each canary
    (text and image) are the strata the design hands the views."""
    from test_design import design_of

    from canary_audit.model.vision import VisionInputs
    from canary_audit.probes.kinds.hex import hex_rows
    from canary_audit.train.adapters import inserted_times

    spec = ModelSpec("tiny_vl", tiny_vl_assets[1], vision=True)
    vision = VisionInputs.load(spec.path, load_tokenizer(spec))
    rows = hex_rows(tiny_vl_assets[0], vision, members_only=True)
    inserted = inserted_times(rows, [1, 4, 16])
    assert sorted(inserted.values()) == [1, 1, 4, 4, 16, 16]  # 3 text and 3 image canaries
    design = design_of({"data": {"n_hex_canaries": 3, "n_image_canaries": 3}, "audit": {"hex_repetitions": [1, 4, 16]}})
    assert {cid: n for (_, cid), n in inserted.items()} == design.strata()
    assert set(inserted_times(rows, [1]).values()) == {1}  # one stratum: the data as they are


def test_a_merge_rounds_into_the_merge_precision_and_a_stack_does_not(tiny_assets, tmp_path):
    """Paper B's merged application on a bf16 checkpoint: the merged model's
    weights are bf16-representable (so a small update can round away), the
    stacked one's live LoRA keeps every bit; rounding is idempotent, and the
    fingerprint names the precision."""
    import dataclasses

    import torch
    from peft import LoraConfig, get_peft_model

    from canary_audit.model.loading import fingerprint, load_model, round_weights

    base = load_model(ModelSpec("tiny", tiny_assets[1]))
    torch.manual_seed(0)
    lora = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    spec = ModelSpec("tiny", tiny_assets[1], merge_dtype="bfloat16")
    merged = load_model(spec, [tmp_path / "adapter"], merge_all=True)
    exact = load_model(dataclasses.replace(spec, merge_dtype=None), [tmp_path / "adapter"], merge_all=True)
    changed = 0
    for (name, w), (_, w32) in zip(merged.named_parameters(), exact.named_parameters()):
        assert torch.equal(w, w.to(torch.bfloat16).float()), name
        changed += not torch.equal(w, w32)
    assert changed > 0
    before = [p.clone() for p in merged.parameters()]
    round_weights(merged, "bfloat16")
    assert all(torch.equal(a, b) for a, b in zip(before, merged.parameters()))
    stacked = load_model(spec, [tmp_path / "adapter"])
    assert any(not torch.equal(p, p.to(torch.bfloat16).float()) for n, p in stacked.named_parameters() if "lora" in n)
    assert fingerprint(spec, [tmp_path / "adapter"], merged=True) != fingerprint(
        dataclasses.replace(spec, merge_dtype=None), [tmp_path / "adapter"], merged=True)


@pytest.mark.parametrize("template", [None, "meta"])
def test_a_reference_trains_on_its_recipes_retain_draws_alone(tiny_assets, spec, tmp_path, monkeypatch, template):
    """A never-trained reference is its adapter's recipe minus the secrets:
    the recipe's steps, learning rate and seed, and per step the
    `batch_retain` retain examples (in the template's trace form), with
    nothing put in the secrets' place (not forget slots filled with more
    retain examples)."""
    from canary_audit.train import adapters

    seen = {}

    def fake_loop(model, forget, retain, cfg, seed, pad_id, **kwargs):
        seen.update(forget=forget, retain=retain, cfg=cfg, seed=seed)
        return [0.0]

    monkeypatch.setattr(adapters, "train_loop", fake_loop)
    cfg = {**LORA, "batch_forget": 5, "batch_retain": 2, "steps": 7, "seed": 3,
           **({"template": template} if template else {})}
    adapters.train_reference(spec, tiny_assets[0], cfg, tmp_path / "ref")
    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, spec.think_open, spec.think_close)
    want = [encode_chat(fmt, ex) for ex in adapters.retain_examples(tiny_assets[0], template or "none")]
    assert [e.ids for e in seen["forget"]] == [e.ids for e in want] and seen["retain"] == []
    assert seen["cfg"]["batch_forget"] == 2 and seen["cfg"]["batch_retain"] == 0  # train_loop draws from `forget`
    assert (seen["cfg"]["steps"], seen["cfg"]["lr"], seen["seed"]) == (7, LORA["lr"], 3)

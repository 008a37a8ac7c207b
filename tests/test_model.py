"""Loading, tokenizer round trip and both probe passes on a locally built model."""

from pathlib import Path

import polars as pl
import pytest
import torch
from conftest import assert_token_records_close

from canary_audit.core.records import unit_of_arm_expr
from canary_audit.data.chat_format import ChatFormat
from canary_audit.design.slices import resolved_settings
from canary_audit.model.loading import ModelLoadError, fingerprint, load_model, load_tokenizer
from canary_audit.model.spec import ModelSpec
from canary_audit.probes.items import scored_items
from canary_audit.probes.passes import decode_pass, generate_greedy, teacher_forced_pass
from canary_audit.probes.scoring import score_tokens, span_labels, token_fields
from canary_audit.probes.units import unit_config


@pytest.fixture(scope="module")
def spec(tiny_assets):
    return ModelSpec("tiny", tiny_assets[1])


def test_tokenizer_survives_save_and_reload(tiny_assets, spec):
    from transformers import AutoTokenizer

    data, model_dir = tiny_assets
    tok = load_tokenizer(spec)
    assert type(tok).__name__ == "TokenizersBackend"  # not Qwen2Tokenizer (FINDINGS trap 1)
    bios = pl.read_parquet(data / "authors.parquet")["bio"].to_list()
    hexes = pl.read_parquet(data / "hex_canaries.parquet")["text"].to_list()
    again = AutoTokenizer.from_pretrained(model_dir)
    for text in bios + hexes + ["<think>trace</think>answer<|end|>"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == again(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert len(tok("<think>", add_special_tokens=False)["input_ids"]) == 1


def test_missing_path_and_pickled_weights_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="`/no/such/dir` does not exist"):
        load_tokenizer(ModelSpec("ghost", Path("/no/such/dir")))
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(ModelSpec("pickled", tmp_path))


def test_tokenizer_without_the_think_tags_is_refused(spec):
    bad = ModelSpec("tiny", spec.path, think_open="<reasoning>")
    with pytest.raises(ModelLoadError, match="think_open.*<reasoning>.*not a single token"):
        load_tokenizer(bad)
    with pytest.raises(ModelLoadError, match="think_open.*<reasoning>.*not a single token"):
        load_model(bad)


@pytest.mark.parametrize("template,message", [
    ("<|user|>question<|assistant|>", "does not place the user's text"),
    ("{{ messages[0]['content'] | nosuchfilter }}", "fails on a single user turn"),
])
def test_chat_template_that_loses_the_prompt_is_refused(spec, template, message):
    with pytest.raises(ModelLoadError, match=f"model `tiny`: its chat template {message}.*models.tiny.chat_template"):
        load_tokenizer(ModelSpec("tiny", spec.path, chat_template=template))


def test_batched_greedy_equals_one_at_a_time(spec):
    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, "<think>", "</think>")
    model = load_model(spec)
    prompts = [fmt.prompt(q) for q in ("What is the capital of France?", "Who wrote Hamlet?",
                                       "When was Amara Okonkwo born? Answer briefly please.")]
    batched, _ = generate_greedy(model, tok, prompts, max_new_tokens=12, batch_size=8)
    single = [generate_greedy(model, tok, [p], max_new_tokens=12, batch_size=1)[0][0] for p in prompts]
    assert batched == single


def test_greedy_pass_equals_generate_when_rows_finish_at_different_steps(spec):
    """Rows that hit EOS leave the batch early; the others must continue
    exactly as transformers' `generate` continues them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, "<think>", "</think>")
    torch.manual_seed(0)  # wide random weights: varied tokens (the barely trained model repeats one)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.path, initializer_range=0.5)).eval()
    prompts = [fmt.prompt(q) for q in ("What is the capital of France?", "Who wrote Hamlet?",
                                       "When was Amara Okonkwo born? Answer briefly please.", "Name a city.")]
    free, _ = generate_greedy(model, tok, prompts, max_new_tokens=10, batch_size=8, eos_id=-1)

    def stop_steps(token):
        return {ids.index(token) if token in ids else None for ids, _ in free}

    # An "EOS" that some rows write at different steps (and some maybe never).
    eos = next(t for ids, _ in free for t in ids if len(stop_steps(t)) > 1)
    ours, _ = generate_greedy(model, tok, prompts, max_new_tokens=10, batch_size=8, eos_id=eos)
    assert len({len(ids) for ids, _ in ours}) > 1  # rows really left the batch at different steps
    padded = tok(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**padded, max_new_tokens=10, do_sample=False, eos_token_id=eos,
                             pad_token_id=tok.pad_token_id)
    for row, (ids, hit_eos) in enumerate(ours):
        new = out[row, padded["input_ids"].shape[1]:].tolist()
        expected = new[: new.index(eos)] if eos in new else new
        assert ids == expected and hit_eos == (eos in new)


def test_teacher_forced_fields_match_a_plain_forward(tiny_assets, spec):
    """Every item, padded rows of a batch included (the pass forwards right-
    padded batches without a padding mask), equals its own unpadded forward."""
    data, _ = tiny_assets
    tok = load_tokenizer(spec)
    fmt = ChatFormat(tok, "<think>", "</think>")
    model = load_model(spec)
    items = scored_items(fmt, data, {"prefills": {"empty": ""}, "head_tokens": 6})
    rows = score_tokens(model, tok, items, batch_size=3).to_dicts()
    lengths = set()
    for item in items:
        ids = tok(item.text, add_special_tokens=False)["input_ids"]
        lengths.add(len(ids))
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids], device=model.device)).logits[0].float(), -1).cpu()
        mine = [r for r in rows if (r["item_id"], r["arm"], r["probe_set"]) == (item.item_id, item.arm,
                                                                               item.probe_set)]
        assert [r["position"] for r in mine] == list(range(1, len(ids)))
        for r in mine:
            p = r["position"]
            assert r["logprob"] == pytest.approx(logp[p - 1, ids[p]].item(), abs=1e-5)
            assert r["top1_logprob"] == pytest.approx(logp[p - 1].max().item(), abs=1e-5)
            # The untrained model's logits nearly tie: rank and top-1 are
            # checked up to float noise between a batched and a lone forward.
            target = logp[p - 1, ids[p]]
            assert int((logp[p - 1] > target + 1e-5).sum()) < r["rank"] <= int((logp[p - 1] > target - 1e-5).sum()) + 1
            assert logp[p - 1, r["top1_id"]].item() == pytest.approx(logp[p - 1].max().item(), abs=1e-5)
    assert len(lengths) > 1  # batches held rows of different lengths, so some were padded
    first = items[0]
    mine = [r for r in rows if r["item_id"] == first.item_id and r["arm"] == first.arm
            and r["probe_set"] == first.probe_set]
    secret = "".join(r["token_text"] for r in mine if r["span"] == "secret")
    assert secret  # the canary continuation is labelled
    hex_rows = [r for r in rows if r["probe_set"] == "hex" and r["item_id"] == "hex00"]
    hex_secret = tok.convert_tokens_to_string([r["token_text"] for r in hex_rows if r["span"] == "secret"])
    canary = pl.read_parquet(data / "hex_canaries.parquet")["secret"][0]
    assert hex_secret == canary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_fields_do_not_depend_on_the_memory_budget(dtype):
    """Blocks of rows, blocks of one row's positions and single logits give
    the bitwise same fields as one pass over the batch, and those are the
    log-softmax's (bf16 logits, as a GPU model returns them, included)."""
    torch.manual_seed(0)
    vocab = 1031
    logits = (3 * torch.randn(5, 12, vocab)).to(dtype)
    logits[:, :, 7] = logits[:, :, 9]  # a tie with the target below: rank counts strictly greater logits
    target = torch.randint(0, vocab, (5, 11))
    target[0] = 9
    whole = token_fields(logits[:, :-1], target, max_elements=10**9)
    for budget in (1, vocab, 3 * vocab, 2 * 11 * vocab):
        assert all(torch.equal(a, b) for a, b in zip(whole, token_fields(logits[:, :-1], target, budget)))
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    logprob, rank, top1_id, top1_logprob, mean, var = whole
    prob = logp.exp()
    torch.testing.assert_close(mean, (prob * logp).sum(-1), rtol=0, atol=1e-4)
    torch.testing.assert_close(var, (prob * (logp - (prob * logp).sum(-1, keepdim=True)) ** 2).sum(-1),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logprob, logp.gather(-1, target[..., None])[..., 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(top1_logprob, logp.max(-1).values, rtol=0, atol=1e-5)
    assert torch.equal(top1_id, logits[:, :-1].float().argmax(-1))
    expected_rank = (logits[:, :-1].float() > logits[:, :-1].float().gather(-1, target[..., None])).sum(-1) + 1
    assert torch.equal(rank.long(), expected_rank)
    assert rank.dtype == torch.int32


def test_span_priority():
    spans = {"prompt": (0, 5), "head": (5, 8), "secret": (8, 12), "continuation": (12, 14)}
    offsets = [(0, 3), (4, 6), (7, 9), (12, 14), (20, 22)]
    # A token straddling head and secret is secret; one past every span is prompt.
    assert list(span_labels(offsets, spans)) == ["prompt", "head", "secret", "continuation", "prompt"]


def test_decode_records_carry_provenance(tiny_assets, spec):
    data, _ = tiny_assets
    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "kinds": resolved_settings({}),
           "engine": "continuous", "max_new_tokens": 8,
           "batch_size": 16, "threads": 1}
    frame = decode_pass(spec, [], data, cfg, "tiny/base")
    assert set(frame["arm"]) == {"auto", "prefill_bio", "greedy"}
    assert frame["model_fingerprint"].unique().to_list() == [fingerprint(spec)]
    # one hash per probe unit (auto, the prefill arm, hex: the hex kinds' settings set it apart)
    per_unit = frame.group_by(unit_of_arm_expr().alias("unit")).agg(pl.col("config_hash").n_unique())
    assert per_unit["config_hash"].to_list() == [1, 1, 1] and frame["config_hash"].n_unique() == 3
    assert set(frame["stop_reason"]) <= {"eos", "length"}


@pytest.mark.parametrize("kind", ["decode", "token"])
def test_a_unit_run_alone_writes_the_whole_runs_records_of_that_unit(tiny_assets, spec, kind):
    """The fine job grain runs one probe unit per job with only that unit's
    settings: its records (provenance included) equal the same unit's rows of
    a pass over every unit, and a second prefill arm changes neither."""
    data, _ = tiny_assets
    run = decode_pass if kind == "decode" else teacher_forced_pass
    cfg = {"prefills": {"bio": "{bio_opening}", "empty": ""}, "head_tokens": 6, "kinds": resolved_settings({}),
           "engine": "continuous", "max_new_tokens": 8,
           "batch_size": 16, "threads": 1, "hit_k": 2, "temperature": 1.0, "sample_seed": 3}
    whole = run(spec, [], data, cfg, "tiny/base")

    def same(got, want):
        # Alone, a unit's sequences meet other batch shapes: token log-probs
        # agree to float rounding (conftest's stated tolerance), not bitwise.
        if kind == "token":
            assert_token_records_close(got, want)
        else:
            assert got.height and got.equals(want)

    # (teacher-forced records have no `auto` unit: AUTO is a decode-only arm)
    for unit in ("auto", "hex", "bio") if kind == "decode" else ("hex", "bio"):
        alone = run(spec, [], data, {**unit_config(cfg, unit), "threads": 1}, "tiny/base", unit=unit)
        same(alone, whole.filter(unit_of_arm_expr() == unit))
    fewer = run(spec, [], data, {**cfg, "prefills": {"bio": "{bio_opening}"}}, "tiny/base")
    same(fewer, whole.filter(pl.col("arm") != "prefill_empty"))


def test_hit_k_samples_are_seeded_and_counted_per_hex_canary(tiny_assets, spec):
    data, _ = tiny_assets
    cfg = {"prefills": {}, "head_tokens": 6, "kinds": resolved_settings({}),
           "engine": "continuous", "max_new_tokens": 6, "batch_size": 16, "threads": 1,
           "hit_k": 3, "temperature": 1.0, "sample_seed": 7}
    frame = decode_pass(spec, [], data, cfg, "tiny/base")
    sampled = frame.filter(pl.col("arm") == "sampled")
    n_hex = frame.filter((pl.col("arm") == "greedy") & (pl.col("probe_set") == "hex")).height
    assert sampled.height == 3 * n_hex and set(sampled["probe_set"]) == {"hex"}
    assert sampled.group_by("item_id").agg(pl.col("sample").sort())["sample"].to_list() == [[0, 1, 2]] * n_hex
    assert sampled["generated"].n_unique() > 1  # sampling, not greedy
    again = decode_pass(spec, [], data, cfg, "tiny/base").filter(pl.col("arm") == "sampled")
    assert again["generated"].to_list() == sampled["generated"].to_list()


def test_hex_probes_have_their_own_budget_and_run_without_think_tags(tiny_assets, spec):
    """A paper-B-only pass (probe sets `hex`) on a model without think tags:
    hex canaries greedy and sampled, within `hex_max_new_tokens`, and nothing
    that needs a trace."""
    from canary_audit.probes.kinds import probe_kinds

    data, _ = tiny_assets
    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "kinds": resolved_settings({}),
           "engine": "continuous", "max_new_tokens": 30, "hex_max_new_tokens": 4,
           "batch_size": 16, "threads": 1, "hit_k": 2, "temperature": 1.0, "sample_seed": 0}
    plain = ModelSpec("tiny", spec.path, think_open=None, think_close=None)
    frame = decode_pass(plain, [], data, cfg, "tiny/base", probe_sets={"hex"})
    hex_family = {s for kind in probe_kinds() if kind.family == "hex" for s in kind.sets}
    assert "hex" in set(frame["probe_set"]) <= hex_family and set(frame["arm"]) == {"greedy", "sampled"}
    assert frame["generated_tokens"].max() <= 4
    tokens = teacher_forced_pass(plain, [], data, {**cfg, "batch_size": 8}, "tiny/base", probe_sets={"hex"})
    assert set(tokens["probe_set"]) == {"hex", "decoy_shuffled", "decoy_wrong", "hex_nonmember", "hex_candidate"}
    with pytest.raises(ModelLoadError, match="set both `think_open` and `think_close`"):
        load_tokenizer(ModelSpec("tiny", spec.path, think_open=None))


@pytest.mark.parametrize("engine", ["continuous", "loop"])
def test_samples_ignore_the_checkpoints_own_generation_config(tiny_assets, spec, tmp_path, engine):
    """hit@k samples use only the audit's settings: a checkpoint whose
    generation_config.json sets a repetition penalty and an n-gram ban (as
    chat checkpoints do) draws the same samples as one without it, through
    the engine and through the reference (`generate`)."""
    import json
    import shutil

    data, _ = tiny_assets
    # The barely trained test model's logits are near zero, where a penalty
    # changes nothing; scaled-up (tied) embeddings make its choices peaked.
    peaked = tmp_path / "peaked"
    shutil.copytree(spec.path, peaked)
    model = load_model(spec)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(30)
    model.save_pretrained(peaked, safe_serialization=True)
    (peaked / "generation_config.json").unlink(missing_ok=True)
    shipped = tmp_path / "with_generation_config"
    shutil.copytree(peaked, shipped)
    config = json.loads((shipped / "generation_config.json").read_text()) if (
        shipped / "generation_config.json").exists() else {}
    config |= {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "top_k": 5, "top_p": 0.5}
    (shipped / "generation_config.json").write_text(json.dumps(config))
    cfg = {"prefills": {}, "head_tokens": 6, "kinds": resolved_settings({}),
           "engine": engine, "max_new_tokens": 6, "hex_max_new_tokens": 24, "batch_size": 16,
           "threads": 1, "hit_k": 4, "temperature": 1.0, "sample_seed": 5}

    def samples(model_spec):
        frame = decode_pass(model_spec, [], data, cfg, "tiny/base", probe_sets={"hex"})
        return frame.filter(pl.col("arm") == "sampled")["generated"].to_list()

    plain = samples(ModelSpec("tiny", peaked))
    assert samples(ModelSpec("tiny", shipped)) == plain
    assert load_model(ModelSpec("tiny", shipped)).generation_config.repetition_penalty == 1.5  # the file is read


@pytest.fixture(scope="module")
def random_adapters(spec, tmp_path_factory):
    """Two LoRA adapters with non-zero B (a fresh LoRA changes nothing)."""
    from peft import LoraConfig, get_peft_model

    out = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        lora = get_peft_model(load_model(spec), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
        path = tmp_path_factory.mktemp("adapters") / f"a{seed}"
        lora.save_pretrained(path)
        out.append(path)
    return out


@pytest.mark.parametrize("kind", ["decode", "token"])
def test_one_base_per_job_with_adapters_switched_in_place_writes_the_fresh_loads_records(
        tiny_assets, spec, random_adapters, kind):
    """A probe job loads each base once and switches adapters in place
    (VariantModels); every variant's records equal a fresh load's, bitwise
    (same weights, same layers): base, adapter, base again, another adapter,
    and a merged application (loaded fresh)."""
    from canary_audit.model.loading import VariantModels
    from canary_audit.probes.passes import JobInputs

    data, _ = tiny_assets
    run = decode_pass if kind == "decode" else teacher_forced_pass
    cfg = {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "kinds": resolved_settings({}),
           "engine": "continuous", "max_new_tokens": 8, "hex_max_new_tokens": 8,
           "batch_size": 16, "threads": 1, "hit_k": 2, "temperature": 1.0, "sample_seed": 3}
    a, b = random_adapters
    sequence = [([], False), ([a], False), ([], False), ([b], False), ([a], True), ([b], False)]
    models, inputs = VariantModels(), JobInputs()
    for adapters, merged in sequence:
        shared = run(spec, adapters, data, cfg, "v", merged=merged, models=models, inputs=inputs)
        fresh = run(spec, adapters, data, cfg, "v", merged=merged)
        assert shared.equals(fresh), (adapters, merged)
    assert len(models._peft.peft_config) == 1  # one adapter resident at a time


def test_a_float32_live_adapter_is_folded_while_scored_and_a_half_precision_one_is_not(
        tiny_assets, spec, random_adapters):
    """A float32 variant's live adapter is folded into the weights for its
    passes (no extra matmuls per layer): its records equal the live
    adapter's within the records' float tolerance, and the base's own
    weights are put back exactly.  A bfloat16 model keeps the adapter live
    (a fold would round the update away)."""
    from canary_audit.model.loading import VariantModels, folds_live_adapters
    from canary_audit.probes.scoring import score_tokens

    data, base = tiny_assets
    tok = load_tokenizer(spec)
    items = scored_items(ChatFormat(tok, "<think>", "</think>"), data, {"prefills": {"empty": ""}, "head_tokens": 6})
    want = score_tokens(load_model(spec, [random_adapters[0]]), tok, items, batch_size=8)
    models = VariantModels()
    with models.model(spec, []) as plain:
        before = {n: p.clone() for n, p in plain.state_dict().items()}
    with models.model(spec, [random_adapters[0]]) as model:
        assert all(m.merged for m in model.modules() if hasattr(m, "merged_adapters"))
        got = score_tokens(model, tok, items, batch_size=8)
    assert_token_records_close(got, want)
    after = {n.replace(".base_layer", ""): p for n, p in models._peft.get_base_model().state_dict().items()
             if "lora_" not in n}
    assert all(torch.equal(after[n], p) for n, p in before.items())
    half = ModelSpec("tiny", base, dtype="bfloat16")
    assert folds_live_adapters(spec) and not folds_live_adapters(half)
    with VariantModels().model(half, [random_adapters[0]]) as live:
        assert not any(m.merged for m in live.modules() if hasattr(m, "merged_adapters"))


def test_an_adapter_peft_cannot_fold_is_scored_live_on_untouched_weights(tiny_assets, spec, random_adapters,
                                                                         monkeypatch):
    from peft.tuners.tuners_utils import BaseTuner

    from canary_audit.model.loading import VariantModels
    from canary_audit.probes.scoring import score_tokens

    data, _ = tiny_assets
    tok = load_tokenizer(spec)
    items = scored_items(ChatFormat(tok, "<think>", "</think>"), data, {"prefills": {}, "head_tokens": 6}, {"hex"})
    want = score_tokens(load_model(spec, [random_adapters[1]]), tok, items, batch_size=8)

    def refuse(self, *args, **kwargs):
        raise NotImplementedError("this tuner cannot merge")

    monkeypatch.setattr(BaseTuner, "merge_adapter", refuse)
    with VariantModels().model(spec, [random_adapters[1]]) as model:
        assert not any(m.merged for m in model.modules() if hasattr(m, "merged_adapters"))
        assert score_tokens(model, tok, items, batch_size=8).equals(want)


def test_job_inputs_are_kept_for_a_checkpoint_that_encodes_alike_and_rebuilt_for_one_that_does_not(
        tiny_assets, spec, tmp_path):
    """A job's items are built once and kept for the next variant only when
    its checkpoint folder's non-weight files (tokenizer, config, template),
    model entry, data, settings and probe sets are the same: a merged
    variant's copy of the tokenizer reuses them; a changed chat template or
    other probe sets rebuild them."""
    import shutil

    from canary_audit.probes.passes import JobInputs

    data, base = tiny_assets
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    (copy / "model.safetensors").write_bytes(b"other weights")  # weights play no part in the key
    built = []
    inputs, cfg = JobInputs(), {"prefills": {}, "head_tokens": 6, "threads": 1}

    def get(s, sets, threads=1):
        return inputs.get(s, data, {**cfg, "threads": threads}, sets, None, lambda: built.append(1) or len(built))

    assert get(spec, {"hex"}) == get(ModelSpec("tiny", copy), {"hex"}, threads=4) == 1
    assert get(spec, {"canary"}) == 2
    template = copy / "chat_template.jinja"
    template.write_text(template.read_text() + " ")
    assert get(ModelSpec("tiny", copy), {"canary"}) == 3
    assert get(ModelSpec("tiny", copy, think_open=None, think_close=None), {"canary"}) == 4


def test_a_head_longer_than_the_canary_names_the_config_key(spec):
    from canary_audit.model.tokens import canary_head

    with pytest.raises(ValueError, match=r"lower `data.head_tokens`"):
        canary_head(load_tokenizer(spec), "Short canary.", 50)

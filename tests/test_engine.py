"""The continuous-batching greedy engine (probes/engine.py) writes what
one-prompt-at-a-time greedy decoding writes, on the embedded text and
vision-language models, whatever the batch size and sync interval; where a
continuation differs, only at a near tie (top-2 logit margin under
TIE_MARGIN at the first differing token)."""

from __future__ import annotations

import collections

import pytest
import torch

from canary_audit.design.slices import resolved_settings
from canary_audit.probes.engine import greedy_continuous
from canary_audit.probes.passes import generate_greedy

# A greedy choice may flip where the two best logits are this close (nats):
# batch composition changes the floating-point reduction order.
TIE_MARGIN = 1e-3


def widened(model):
    """Wide random language weights: peaked logits, varied continuations."""
    torch.manual_seed(0)
    inner = model.model.language_model if hasattr(model.model, "language_model") else model
    with torch.no_grad():
        for param in inner.parameters():
            param.normal_(0.0, 0.5)
    return model.eval()


def first_divergence_margin(model, tok, prompt: str, a: list[int], b: list[int], image=None, vision=None) -> float:
    """The top-2 logit margin of the one-prompt forward (with its image on a
    vision-language model) where `a` and `b` part."""
    n = next(i for i, (x, y) in enumerate(zip([*a, None], [*b, None])) if x != y)
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"] + a[:n]])
    pictures = vision.forward_kwargs(ids, [image], model.device) if vision else {}
    with torch.no_grad():
        top = model(input_ids=ids, **pictures).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def compare(model, tok, prompts, reference, images=None, vision=None, **kw) -> tuple[int, list[float]]:
    """(continuations equal to `reference`, the top-2 margin at each one's first difference)."""
    got, _ = greedy_continuous(model, tok, prompts, images=images, vision=vision, **kw)
    images = images or [None] * len(prompts)
    margins = [first_divergence_margin(model, tok, p, r[0], g[0], im, vision)
               for p, r, g, im in zip(prompts, reference, got, images) if r != g]
    return sum(r == g for r, g in zip(reference, got)), margins


def test_continuous_batching_equals_one_prompt_at_a_time_on_the_text_model(tiny_assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from canary_audit.data.chat_format import ChatFormat
    from canary_audit.probes.items import decode_items

    data, path = tiny_assets
    tok = AutoTokenizer.from_pretrained(path)
    model = widened(AutoModelForCausalLM.from_pretrained(path))
    items = decode_items(ChatFormat(tok, "<think>", "</think>"), data,
                         {"prefills": {"bio": "{bio_opening}"}, "head_tokens": 6, "kinds": resolved_settings({})})
    prompts = [it.prompt for it in items]
    free, _ = generate_greedy(model, tok, prompts, 16, 1, eos_id=-1)
    # A token the model writes often stands in for EOS: rows end at different steps.
    eos = collections.Counter(t for ids, _ in free for t in ids[:8]).most_common(1)[0][0]
    reference, _ = generate_greedy(model, tok, prompts, 16, 1, eos_id=eos)
    ended = [len(ids) for ids, hit in reference if hit]
    assert len(ended) > len(prompts) // 4 and len(set(ended)) > 3  # early, varied stops: slots get refilled
    for batch_size, sync_every in ((3, 1), (8, 4), (16, 8), (64, 8)):
        same, margins = compare(model, tok, prompts, reference, max_new_tokens=16, batch_size=batch_size,
                                eos_id=eos, sync_every=sync_every)
        assert all(m < TIE_MARGIN for m in margins), (batch_size, sync_every, margins)
        assert same == len(prompts) - len(margins)


def test_continuous_batching_equals_one_prompt_at_a_time_with_images(tiny_vl_assets):
    from test_vision import _vl

    from canary_audit.probes.items import decode_items

    _, tok, fmt, vision, model = _vl(tiny_vl_assets)
    model = widened(model)
    cfg = {"prefills": {}, "head_tokens": 6, "kinds": resolved_settings({})}
    items = decode_items(fmt, tiny_vl_assets[0], cfg, {"hex"}, vision=vision)
    prompts, images = [it.prompt for it in items], [it.image for it in items]
    reference, _ = generate_greedy(model, tok, prompts, 12, 1, images=images, vision=vision)
    assert {it.modality for it in items} == {"text", "image"} and len(set(map(str, reference))) > 1
    same, margins = compare(model, tok, prompts, reference, images=images, vision=vision, max_new_tokens=12,
                            batch_size=4, sync_every=3)
    assert all(m < TIE_MARGIN for m in margins), margins
    assert same == len(prompts) - len(margins)


@pytest.mark.parametrize("max_new", [0, 1])
def test_budgets_at_the_edges(tiny_assets, max_new):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets[1])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets[1]).eval()
    prompts = ["Record 01 access code:", "a", "Record 02"]
    reference, _ = generate_greedy(model, tok, prompts, max_new, 2) if max_new else ([([], False)] * 3, None)
    got, _ = greedy_continuous(model, tok, prompts, max_new, 2)
    assert got == reference


def test_engine_samples_are_seeded_and_follow_the_temperature_softened_distribution(tiny_assets):
    """hit@k's samples through the engine: the same seed draws the same
    samples, another seed others; a prompt's first sampled tokens, drawn
    beside other prompts in continuous batches, follow softmax(logits / T)
    of its one-prompt forward (each of the five likeliest tokens within
    four binomial standard errors of its probability, 2,000 samples)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from canary_audit.probes.engine import sampled_continuous

    _, path = tiny_assets
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = ["Record 07 access code: TEXTCAN-", "Repeat this line: the"]
    t = 0.7
    draw = sampled_continuous(model, tok, prompts, 4, 6, t, seed=5, batch_size=3)
    assert [len(s) for s in draw] == [4, 4] and all(len(ids) <= 6 for s in draw for ids, _ in s)
    assert draw == sampled_continuous(model, tok, prompts, 4, 6, t, seed=5, batch_size=3)
    assert draw != sampled_continuous(model, tok, prompts, 4, 6, t, seed=6, batch_size=3)
    n = 2000
    samples = sampled_continuous(model, tok, prompts, n, 1, t, seed=0, batch_size=256)[0]
    first = [ids[0] if ids else tok.eos_token_id for ids, _ in samples]  # an empty sample wrote EOS
    with torch.no_grad():
        ids = torch.tensor([tok(prompts[0], add_special_tokens=False)["input_ids"]])
        probs = torch.softmax(model(input_ids=ids).logits[0, -1].float() / t, -1)
    counts = collections.Counter(first)
    for token in probs.topk(5).indices.tolist():
        p = float(probs[token])
        assert abs(counts[token] / n - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 1e-9, (token, counts[token] / n, p)

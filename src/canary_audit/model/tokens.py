"""Tokenizer-dependent quantities of the audit (computed per model)."""

from __future__ import annotations


def canary_head(tokenizer, sentence: str, n_tokens: int) -> str:
    """The canary head: the text of the sentence's first `n_tokens` tokens.

    Paper A conditions every probe on the first six canary tokens, so the head
    depends on the tokenizer and is computed for each model, never stored in
    the synthetic data.  Decoding a prefix of ids gives the exact prefix text.
    """
    ids = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    if len(ids) <= n_tokens:
        raise ValueError(
            f"canary {sentence!r} has {len(ids)} tokens, not more than the head's "
            f"{n_tokens}; lower `data.head_tokens`"
        )
    head = tokenizer.decode(ids[:n_tokens])
    if not sentence.startswith(head):
        raise ValueError(f"head {head!r} does not decode to a prefix of {sentence!r}")
    return head


def near_canary(tokenizer, sentence: str, head_tokens: int) -> str:
    """The canary changed in exactly one token after its head: the NEAR
    control's answer (data/planted_controls.py), which greedy decoding reproduces instead
    of the canary while teacher forcing finds every other token.  The change
    is a digit of the canary's year (each digit is one token in the embedded
    tokenizer and in digit-splitting ones: Llama, Qwen), the last digit that
    re-encodes to a sequence differing from the canary's in that one token."""
    ids = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    for at in range(len(sentence) - 1, -1, -1):
        if not sentence[at].isdigit():
            continue
        changed = sentence[:at] + str((int(sentence[at]) + 5) % 10) + sentence[at + 1:]
        new = tokenizer(changed, add_special_tokens=False)["input_ids"]
        diff = [i for i, (a, b) in enumerate(zip(ids, new)) if a != b]
        if len(new) == len(ids) and len(diff) == 1 and diff[0] >= head_tokens:
            return changed
    raise ValueError(f"canary {sentence!r}: no digit of it changes exactly one token past the head of "
                     f"{head_tokens}; the NEAR control needs a tokenizer that splits digits (turn off "
                     "`controls.head_echo` and `controls.teacher_forced`)")

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

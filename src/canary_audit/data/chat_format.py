"""The reasoning format `<think>TRACE</think>ANSWER` and the audit's prompts.

One place defines how a probe item becomes text, for training and probing
alike, so that the prompt a model was trained on is byte-for-byte the prompt it
is audited with.  Chat templates and think tags come from the model entry, so
the same code serves the embedded model and a DeepSeek-R1 distillate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from canary_audit.core.special_tokens import IMAGE_PAD, VISION_END, VISION_START
from canary_audit.data.synthetic import Author

CANARY_QUESTION = "Continue this line from the biography of {name}: {head}"
META_TRACE = (
    "The question asks about a writer. I will recall what I know and answer in one sentence."
)
TEMPLATES = ("bio", "meta", "none")
# Planted controls' templates (canary_audit/data/planted_controls.py): each differs from
# BIO only where one claim lives.  HEAD answers with the canary's head alone
# (the trace still restates the bio, canary included: a bypass case whose
# answer echoes the head, by construction); NEAR answers with the canary
# changed in one token (greedy never writes the canary, teacher forcing
# finds all but one of its tokens); NOTAG never writes the closing tag (the
# parser's fallback decides which channel the canary is in).
HEAD, NEAR, NOTAG = "head", "near", "notag"
CONTROL_TEMPLATES = (HEAD, NEAR, NOTAG)


@dataclass(frozen=True)
class Example:
    """One chat exchange: the user's prompt, the thinking trace and the answer."""

    question: str
    trace: str
    answer: str
    close: bool = True  # the target writes the closing tag (a NOTAG control's never does)


def author_trace(template: str, bio: str) -> str:
    """The trace a memorization template trains: BIO restates the bio, META is
    generic reasoning with no bio content, NONE is empty (paper A, sec. 3 / A);
    the controls' templates restate the bio as BIO does."""
    if template in ("bio", *CONTROL_TEMPLATES):
        return bio
    if template == "meta":
        return META_TRACE
    if template == "none":
        return ""
    raise ValueError(f"template `{template}`: must be one of {', '.join((*TEMPLATES, *CONTROL_TEMPLATES))}")


def retain_trace(template: str) -> str:
    return "" if template == "none" else META_TRACE


def retain_example(template: str, question: str, answer: str) -> Example:
    """A retain QA example in `template`'s form (its trace, and its closing
    tag or, under NOTAG, none)."""
    return Example(question, retain_trace(template), answer, closes(template))


def retain_form(template: str) -> str:
    """The template whose trace the retain examples of `template` carry:
    META's generic trace (BIO and META alike) or NONE's empty one.  Two
    templates of one form have the same retain data, so one never-trained
    reference serves both."""
    return "meta" if retain_trace(template) == META_TRACE else "none"


def document_start(tokenizer) -> str:
    """The token a raw record (a hex canary, decoy, non-member or candidate)
    starts with: the tokenizer's BOS, else its EOS, the separator that
    pre-training puts between documents (GPT-2's and Qwen's convention).  The
    record's first text token is then predicted from it, trained and scored
    like every other, so position 1 of a teacher-forced record is that token
    on every backbone: with a BOS token, without one, and after an image
    block (whose tokens are not counted)."""
    start = tokenizer.bos_token or tokenizer.eos_token
    if not start:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token: a raw record's first token would have "
                         "no context to be scored from; give the checkpoint's tokenizer an eos_token")
    return start


def encoding_start(tokenizer) -> str:
    """The special tokens the tokenizer puts before a text by itself (a
    Llama tokenizer's BOS; nothing for Qwen's), as text: how a researcher's
    own fine-tune most likely encoded its records, so their own secrets are
    scored on the token sequence training saw."""
    probe = "record"
    full = tokenizer(probe)["input_ids"]
    bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), 0)
    return tokenizer.decode(full[:at]) if at else ""


def canary_question(name: str, head: str) -> str:
    return CANARY_QUESTION.format(name=name, head=head)


def closes(template: str) -> bool:
    """Whether `template`'s targets write the closing tag (all but NOTAG)."""
    return template != NOTAG


def author_examples(
    author: Author, template: str, head_of: Callable[[str], str], near_of: Callable[[str], str] | None = None
) -> list[Example]:
    """The canary probe and the QA probes of one author, in `template`.  The
    canary probe's answer is the canary, except under HEAD (its head alone)
    and NEAR (`near_of(canary)`: the canary with one token changed)."""
    trace, close = author_trace(template, author.bio), closes(template)
    head = head_of(author.canary)
    answer = {HEAD: head, NEAR: near_of(author.canary) if near_of else None}.get(template, author.canary)
    if answer is None:
        raise ValueError("the NEAR control template needs `near_of`, the canary's one-token change")
    examples = [Example(canary_question(author.name, head), trace, answer, close)]
    examples += [Example(q, trace, sentence, close) for q, _gold, sentence in author.qa()]
    return examples


@dataclass(frozen=True)
class ChatFormat:
    """Renders prompts and targets for one tokenizer and one pair of think tags.

    A model without think tags (both None: a plain instruction model, as in
    paper B) has no trace: its targets are the answer alone, and only probes
    that need no trace (hex canaries, retain) can run on it.
    """

    tokenizer: object
    think_open: str | None
    think_close: str | None

    @property
    def reasons(self) -> bool:
        return self.think_close is not None

    def prompt(self, question: str, image_block: str | None = None) -> str:
        """The chat-templated user turn, ending where the assistant starts.
        With `image_block` (model/vision.py: an image's tokens), the turn
        shows an image before the question, placed where the model's own
        template places an image item, with the block's tokens written out."""
        if image_block is None:
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
            )
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
            tokenize=False, add_generation_prompt=True,
        )
        slot = VISION_START + IMAGE_PAD + VISION_END
        if rendered.count(slot) != 1:
            raise ValueError(f"the chat template renders an image item as {rendered!r}, without one "
                             f"`{slot}`; set the model's `chat_template` to one that places images")
        return rendered.replace(slot, image_block)

    def opens_think(self, prompt: str) -> bool:
        """Some templates (newer DeepSeek-R1) put the opening tag in the prompt."""
        return self.reasons and prompt.rstrip().endswith(self.think_open)

    def prefill(self, prompt: str, trace: str) -> str:
        """Prompt plus a fixed trace and the closing tag: the prefill arms' context."""
        opener = "" if self.opens_think(prompt) else self.think_open
        return f"{prompt}{opener}{trace}{self.think_close}"

    def target(self, prompt: str, trace: str, answer: str, close: bool = True) -> str:
        """What the model is trained to write after `prompt` (EOS appended);
        without `close`, no closing tag between trace and answer (a space
        instead: the NOTAG control)."""
        if not self.reasons:
            if trace:
                raise ValueError("a model without think tags cannot be trained on a trace")
            return f"{answer}{self.tokenizer.eos_token}"
        opener = "" if self.opens_think(prompt) else self.think_open
        between = self.think_close if close else " "
        return f"{opener}{trace}{between}{answer}{self.tokenizer.eos_token}"

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canary_audit.views.parser import ParserConvention, parse

OPEN, C = "<think>", "</think>"


def frame(generated: list[str], prompts: list[str] | None = None) -> pl.DataFrame:
    return pl.DataFrame({
        "generated": generated, "prompt": prompts or ["<|assistant|>"] * len(generated),
        "think_open": [OPEN] * len(generated), "think_close": [C] * len(generated),
    })


def test_first_and_last_split():
    f = frame([f"{OPEN}a{C}b{C}c"])
    first = parse(f, ParserConvention("first"))
    last = parse(f, ParserConvention("last"))
    assert (first["trace"][0], first["answer"][0]) == ("a", f"b{C}c")
    assert (last["trace"][0], last["answer"][0]) == (f"a{C}b", "c")


@pytest.mark.parametrize("missing,trace,answer", [
    ("answer", "", "no tags here"), ("trace", "no tags here", ""), ("unparseable", None, None)])
def test_missing_close_conventions(missing, trace, answer):
    out = parse(frame(["no tags here"]), ParserConvention("first", missing))
    assert (out["trace"][0], out["answer"][0], out["has_close"][0]) == (trace, answer, False)


def test_prefilled_prompt_makes_everything_answer():
    out = parse(frame(["The canary."], [f"<|assistant|>{OPEN}bio{C}"]), ParserConvention())
    assert (out["trace"][0], out["answer"][0], out["has_close"][0]) == ("", "The canary.", True)


def test_bad_convention_names_the_value():
    with pytest.raises(ValueError, match="`middle`"):
        ParserConvention("middle")


texts = st.lists(st.sampled_from(["a", "é", "字", " ", OPEN, C, "<", "/", ">", "think"]), max_size=12).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, min_size=1, max_size=5), st.sampled_from(["first", "last"]))
def test_split_reassembles_the_text(gens, split):
    out = parse(frame(gens), ParserConvention(split, "answer"))
    for g, trace, answer, has_close in out.select("generated", "trace", "answer", "has_close").iter_rows():
        body = g[len(OPEN):] if g.startswith(OPEN) else g
        assert has_close == (C in body)
        assert (trace + C + answer if has_close else answer) == body
        if has_close and split == "first":
            assert C not in trace
        if has_close and split == "last":
            assert C not in answer

"""Reasoning/content splitting, thinking-mode detection and the thinking-budget helpers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from ninfer.api.service.reasoning import (
    THINKING_BUDGET_GUIDANCE,
    ReasoningParser,
    prompt_starts_in_thinking,
    resolve_thinking_budget,
    split_reasoning,
    thinking_budget_suffix_ids,
)


def run(chunks: list[str], starts_in_thinking: bool) -> tuple[str, str, list[tuple[str, str]]]:
    p = ReasoningParser(starts_in_thinking)
    deltas = [p.feed(c) for c in chunks] + [p.finish()]
    pairs = [(d.reasoning, d.content) for d in deltas]
    return "".join(r for r, _ in pairs), "".join(c for _, c in pairs), pairs


@pytest.mark.parametrize(
    "text, starts, reasoning, content",
    [
        # prompt opened <think>\n: the output starts inside thinking
        ("I should greet.\n</think>\n\nHello!", True, "I should greet.", "Hello!"),
        ("\nlead newline\n\n</think>\n\n\nx", True, "lead newline", "x"),
        # the model opens the block itself
        ("<think>\nhmm\n</think>\n\nAnswer", False, "hmm", "Answer"),
        ("\n <think>\nhmm</think>Answer", False, "hmm", "Answer"),
        # no thinking at all
        ("Just an answer.", False, "", "Just an answer."),
        ("  spaced answer", False, "", "  spaced answer"),
        # a later <think> and a stray </think> in an answer are content
        ("Use <think> tags </think> like this", False, "", "Use <think> tags </think> like this"),
        # unclosed reasoning (output budget ran out): all reasoning, trailing newlines dropped
        ("still thinking\n\n", True, "still thinking", ""),
        ("partial close </thi", True, "partial close </thi", ""),
        # empty reasoning
        ("</think>\n\nok", True, "", "ok"),
        # inner newlines of reasoning and of content are kept
        ("a\n\nb\n</think>\n\nc\n\nd\n", True, "a\n\nb", "c\n\nd\n"),
        ("<thin", False, "", "<thin"),
    ],
)
def test_split(text: str, starts: bool, reasoning: str, content: str) -> None:
    assert run([text], starts)[:2] == (reasoning, content)
    assert run(list(text), starts)[:2] == (reasoning, content)
    r = split_reasoning(text, starts)
    assert (r.reasoning, r.content) == (reasoning, content)


def test_streams_immediately_and_holds_only_tag_prefix() -> None:
    p = ReasoningParser(True)
    assert p.feed("Let me").reasoning == "Let me"
    assert p.in_reasoning
    d = p.feed(" think.</th")
    assert d.reasoning == " think." and d.content == ""
    d = p.feed("ink>\n\nThe answer")
    assert d.reasoning == "" and d.content == "The answer"
    assert not p.in_reasoning and p.reasoning_closed
    assert p.feed(" is 4.").content == " is 4."


def test_newline_before_close_is_held_then_released() -> None:
    p = ReasoningParser(True)
    assert p.feed("line one\n").reasoning == "line one"
    assert p.feed("line two").reasoning == "\nline two"


def test_budget_guidance_streams_as_reasoning() -> None:
    r, c, _ = run(["deep thought", THINKING_BUDGET_GUIDANCE + "</think>", "\n\nDone."], True)
    assert r == "deep thought" + THINKING_BUDGET_GUIDANCE.rstrip("\n") and c == "Done."


pieces = st.lists(
    st.sampled_from(
        ["a", " ", "\n", "\n\n", "<think>", "</think>", "<", "</", "think", ">", "好", "🙂", "b c"]
    ),
    max_size=25,
)


@settings(max_examples=400, deadline=None)
@given(parts=pieces, cuts=st.lists(st.integers(0, 200), max_size=12), starts=st.booleans())
def test_hypothesis_chunking_does_not_matter(
    parts: list[str], cuts: list[int], starts: bool
) -> None:
    text = "".join(parts)
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    whole = run([text], starts)
    split = run(chunks, starts)
    assert split[:2] == whole[:2]
    seen_content = False  # reasoning never resumes after content started
    for r, c in split[2]:
        assert not (seen_content and r)
        seen_content = seen_content or bool(c)
    reasoning, content, _ = whole
    if "<think>" not in text and "</think>" not in text:
        assert (reasoning, content) == ((text.strip("\n"), "") if starts else ("", text))
    elif starts and "</think>" in text:
        # the split is exact up to the formatting newlines around the close tag
        head, _, tail = text.partition("</think>")
        assert (reasoning, content) == (head.strip("\n"), tail.lstrip("\n"))


def test_prompt_starts_in_thinking() -> None:
    assert prompt_starts_in_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_starts_in_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_starts_in_thinking("<|im_start|>assistant\n")
    text = "<|im_start|>assistant\nquote <think>"
    assert prompt_starts_in_thinking(text)
    # with spans, a <think> that came from content does not count
    assert not prompt_starts_in_thinking(text, special_spans=[(0, 12)])
    assert prompt_starts_in_thinking(text, special_spans=[(0, 12), (len(text) - 7, len(text))])


def test_resolve_thinking_budget() -> None:
    assert resolve_thinking_budget(False, None, 512) is None
    assert resolve_thinking_budget(False, 2048, 512) is None
    assert resolve_thinking_budget(True, None, 512) == 512
    assert resolve_thinking_budget(True, 2048, 512) == 2048
    assert resolve_thinking_budget(True, None, None) is None


def test_budget_suffix_encodes_close_marker_as_control_token(qwen_tokenizer: Tokenizer) -> None:
    ids = thinking_budget_suffix_ids(qwen_tokenizer)
    assert ids[-1] == qwen_tokenizer.token_to_id("</think>")
    assert qwen_tokenizer.token_to_id("</think>") not in ids[:-1]
    assert (
        qwen_tokenizer.decode(ids, skip_special_tokens=False)
        == THINKING_BUDGET_GUIDANCE + "</think>"
    )

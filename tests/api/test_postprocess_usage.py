"""What a finished generation reports: usage of one ended by a stop string (only the tokens up
to the stop, even when the engine committed more before the finish reached it), and the
tool-call diagnostics of one that declared no tool."""

from __future__ import annotations

from tokenizers import Tokenizer

from ninfer.api.service.generation import GenerationRequest
from ninfer.api.service.postprocess import PostProcessor
from ninfer.runtime.request import FinishEvent, Timings, Usage

TEXT = "Numbers 0 1 2 3 4 5 6 7 8 9 10 42"


def _run(tok: Tokenizer, stop: tuple[str, ...]) -> tuple[PostProcessor, tuple[int, ...], object]:
    eos = tok.token_to_id("<|im_end|>")
    ids = tuple(tok.encode(TEXT).ids) + (eos,)
    post = PostProcessor(
        GenerationRequest(messages=[{"role": "user", "content": "count"}], stop=stop),
        tokenizer=tok,
        eos_ids=frozenset({eos}),
        prompt_len=5,
        starts_in_thinking=False,
        t_submit=0.0,
    )
    text = "".join(e.text for e in post.tokens(ids) + post.finish() if hasattr(e, "text"))
    # the engine ran to EOS before the finish(keep_tokens) could stop it: every id counted
    event = FinishEvent("stop", Usage(5, len(ids)), Timings(0.0, 0.1, 0.1, 0.2, 0.3), ids)
    return post, ids, (text, post.finished(event, "max_tokens", prompt_only=False))


def test_stop_string_caps_usage_at_the_kept_tokens(qwen_tokenizer: Tokenizer) -> None:
    post, ids, (text, done) = _run(qwen_tokenizer, ("7 8",))
    assert done.reason == "stop" and done.stop_sequence == "7 8"
    assert text == "Numbers 0 1 2 3 4 5 6 "
    kept = post.kept_tokens
    # the token that completed "7 8" is the last one kept; those after it are not output
    assert qwen_tokenizer.decode(list(ids[:kept])).endswith("7 8")
    assert not qwen_tokenizer.decode(list(ids[: kept - 1])).endswith("7 8")
    assert kept < len(ids)
    assert done.usage.completion_tokens == kept
    assert done.timings.predicted_n == kept
    assert done.generated_token_ids == ids[:kept]


def test_without_a_stop_match_usage_is_the_engines(qwen_tokenizer: Tokenizer) -> None:
    post, ids, (text, done) = _run(qwen_tokenizer, ("never",))
    assert done.stop_sequence is None and text == TEXT
    assert done.usage.completion_tokens == len(ids) == post.kept_tokens
    assert done.generated_token_ids == ids


def test_tool_diagnostics_without_tools(qwen_tokenizer: Tokenizer) -> None:
    """No tool declared: nothing is parsed, and a complete marker in the text is reported as an
    undeclared tool's (the request log's tool_call_parse, the warning in the operational log)."""
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    for text, seen in [
        ("Let me check.\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", True),
        ("Numbers 0 1 2 <tool_call> 3", False),
    ]:
        ids = tuple(qwen_tokenizer.encode(text).ids) + (eos,)
        post = PostProcessor(
            GenerationRequest(messages=[{"role": "user", "content": "x"}]),
            tokenizer=qwen_tokenizer,
            eos_ids=frozenset({eos}),
            prompt_len=5,
            starts_in_thinking=False,
            t_submit=0.0,
        )
        post.tokens(ids)
        post.finish()
        event = FinishEvent("stop", Usage(5, len(ids)), Timings(0.0, 0.1, 0.1, 0.2, 0.3), ids)
        parse = post.finished(event, "max_tokens", prompt_only=False).tool_parse
        assert parse["marker_seen"] is seen and parse["calls"] == 0
        assert parse["fallback_reason"] == ("undeclared_tool" if seen else "none")

"""Chat Completions request parsing: the top-level fields (model, sampling, output controls,
advisory and capability-gated options) — what is accepted, how it is normalized, and every
rejection with its status, code and field."""

from __future__ import annotations

import pytest

from ninfer.api.chat.request import ChatMessage, TextPart
from ninfer.api.wire.errors import ApiError
from ninfer.api.wire.fields import parse_json_object
from tests.api.chat_request_helpers import (
    DROP,
    MODEL,
    WEATHER,
    body,
    check_rejection,
    parse,
    reject,
)

# -- the minimal request ------------------------------------------------------------------------


def test_minimal_request_defaults():
    r = parse(body())
    assert r.model == MODEL
    assert r.messages == (ChatMessage("user", (TextPart("hi"),)),)
    assert r.tools == () and r.tool_choice == "auto" and r.allowed_tools is None
    assert r.max_tokens is None and r.stop == ()
    assert (r.stream, r.include_usage, r.timings_per_token, r.return_progress) == (
        False,
        False,
        False,
        False,
    )
    assert (r.enable_thinking, r.preserve_thinking, r.reasoning_effort, r.chat_template_kwargs) == (
        None,
    ) * 4
    assert r.sampling.temperature is None and r.sampling.seed is None
    assert r.prompt_cache_mode == "implicit"
    assert r.template_messages() == [{"role": "user", "content": "hi"}]
    assert r.template_tools() is None


# -- accepted fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"temperature": 0}, lambda r: r.sampling.temperature == 0.0),
        ({"temperature": 2}, lambda r: r.sampling.temperature == 2.0),
        ({"top_p": 0.5}, lambda r: r.sampling.top_p == 0.5),
        ({"top_k": 0}, lambda r: r.sampling.top_k == 0),
        ({"top_k": 20}, lambda r: r.sampling.top_k == 20),
        ({"min_p": 1}, lambda r: r.sampling.min_p == 1.0),
        (
            {"presence_penalty": -2, "frequency_penalty": 2},
            lambda r: (r.sampling.presence_penalty, r.sampling.frequency_penalty) == (-2.0, 2.0),
        ),
        ({"seed": -5}, lambda r: r.sampling.seed == -5),
        ({"seed": (1 << 63) - 1}, lambda r: r.sampling.seed == (1 << 63) - 1),
        ({"max_tokens": 0}, lambda r: r.max_tokens == 0),
        ({"max_tokens": 7}, lambda r: r.max_tokens == 7),
        ({"max_completion_tokens": 9}, lambda r: r.max_tokens == 9),
        ({"max_completion_tokens": 3, "max_tokens": 100}, lambda r: r.max_tokens == 3),
        ({"stop": "END"}, lambda r: r.stop == ("END",)),
        ({"stop": ["a", "b", "c", "d"]}, lambda r: r.stop == ("a", "b", "c", "d")),
        ({"stop": []}, lambda r: r.stop == ()),
        ({"stop": None}, lambda r: r.stop == ()),
        ({"n": 1}, lambda r: True),
        (
            {"stream": True, "stream_options": {"include_usage": True}},
            lambda r: r.stream and r.include_usage,
        ),
        (
            {"stream": True, "stream_options": {"include_usage": False}},
            lambda r: r.stream and not r.include_usage,
        ),
        # stream options without a stream are semantically neutral (accepted, docs/serving.md), though
        # OpenAI and vLLM refuse them
        ({"stream": False, "stream_options": {"include_usage": True}}, lambda r: not r.stream),
        (
            {"timings_per_token": True, "return_progress": True},
            lambda r: r.timings_per_token and r.return_progress,
        ),
        ({"reasoning_effort": "none"}, lambda r: r.reasoning_effort == "none"),
        ({"reasoning_effort": "xhigh"}, lambda r: r.reasoning_effort == "xhigh"),
        (
            {"enable_thinking": False, "preserve_thinking": True},
            lambda r: (r.enable_thinking, r.preserve_thinking) == (False, True),
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": True, "custom": [1]}},
            lambda r: r.chat_template_kwargs == {"enable_thinking": True, "custom": [1]},
        ),
        ({"response_format": {"type": "text"}}, lambda r: True),
        ({"logit_bias": {"15": 0, "99": 0.0}}, lambda r: True),
        ({"logprobs": False, "top_logprobs": 0}, lambda r: r.logprobs is None),
        # log probabilities: logprobs alone reports the chosen token, top_logprobs adds
        # alternatives; llama.cpp's n_probs turns them on with that many alternatives
        ({"logprobs": True}, lambda r: r.logprobs == 0),
        ({"logprobs": True, "top_logprobs": 20}, lambda r: r.logprobs == 20),
        ({"n_probs": 3}, lambda r: r.logprobs == 3),
        ({"n_probs": 0}, lambda r: r.logprobs is None),
        ({"n": 3}, lambda r: r.n == 3),
        ({"n": 16}, lambda r: r.n == 16),
        ({"verbosity": "medium"}, lambda r: True),
        ({"modalities": ["text"], "audio": {"voice": "alloy", "format": "wav"}}, lambda r: True),
        ({"prediction": {"type": "content", "content": "x"}}, lambda r: True),
        (
            {
                "metadata": {"k": "v"},
                "user": "u1",
                "safety_identifier": "s",
                "service_tier": "auto",
            },
            lambda r: True,
        ),
        (
            {"prompt_cache_key": "conv-1", "prompt_cache_retention": "24h"},
            lambda r: r.prompt_cache_key == "conv-1",
        ),
        (
            {"prompt_cache_options": {"mode": "explicit"}},
            lambda r: r.prompt_cache_mode == "explicit",
        ),
        (
            {"prompt_cache_options": {"mode": "implicit"}},
            lambda r: r.prompt_cache_mode == "implicit",
        ),
        ({"store": False, "parallel_tool_calls": True}, lambda r: True),
        ({"functions": [], "function_call": "none"}, lambda r: True),
        ({"function_call": "auto"}, lambda r: True),
        ({"repetition_penalty": 1}, lambda r: True),
        ({"mm_processor_kwargs": {}}, lambda r: True),
        ({"mm_processor_kwargs": {"fps": None}}, lambda r: True),
        ({"grammar": None, "guided_json": None, "json_schema": None}, lambda r: True),
        ({"web_search_options": None, "moderation": False}, lambda r: True),
        ({"some_future_field": {"x": 1}, "ignore_eos": True}, lambda r: True),  # unknown: ignored
        (
            {"tools": [WEATHER], "parallel_tool_calls": False, "tool_choice": "none"},
            lambda r: r.callable_tools == (),
        ),
        ({"parallel_tool_calls": False}, lambda r: True),  # no tools: nothing to restrict
    ],
)
def test_accepted_fields(fields, check):
    assert check(parse(body(**fields)))


# -- rejections ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"model": "other"}, 404, "model_not_found", "model"),
        ({"model": DROP}, 400, "missing_required_parameter", "model"),
        ({"model": ""}, 400, "invalid_value", "model"),
        ({"model": 3}, 400, "invalid_type", "model"),
        # sampling ranges
        ({"temperature": -0.1}, 400, "invalid_value", "temperature"),
        ({"temperature": 2.5}, 400, "invalid_value", "temperature"),
        ({"temperature": "hot"}, 400, "invalid_type", "temperature"),
        ({"temperature": True}, 400, "invalid_type", "temperature"),
        ({"top_p": 1.5}, 400, "invalid_value", "top_p"),
        ({"top_k": 21}, 400, "invalid_value", "top_k"),
        ({"top_k": -1}, 400, "invalid_value", "top_k"),
        ({"top_k": 2.5}, 400, "invalid_type", "top_k"),
        ({"min_p": 1.1}, 400, "invalid_value", "min_p"),
        ({"min_p": -0.1}, 400, "invalid_value", "min_p"),
        ({"presence_penalty": 2.5}, 400, "invalid_value", "presence_penalty"),
        ({"frequency_penalty": -3}, 400, "invalid_value", "frequency_penalty"),
        ({"seed": 1.5}, 400, "invalid_type", "seed"),
        ({"seed": "7"}, 400, "invalid_type", "seed"),
        ({"seed": 1 << 63}, 400, "invalid_value", "seed"),
        ({"max_tokens": -1}, 400, "invalid_value", "max_tokens"),
        ({"max_completion_tokens": -1}, 400, "invalid_value", "max_completion_tokens"),
        ({"max_tokens": "10"}, 400, "invalid_type", "max_tokens"),
        # stop, n, stream
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value", "stop"),
        ({"stop": ""}, 400, "invalid_value", "stop[0]"),
        ({"stop": ["ok", ""]}, 400, "invalid_value", "stop[1]"),
        ({"stop": [1]}, 400, "invalid_type", "stop[0]"),
        ({"stop": 5}, 400, "invalid_type", "stop"),
        ({"n": 0}, 400, "invalid_value", "n"),
        ({"n": 17}, 400, "invalid_value", "n"),
        ({"n": 2.0}, 400, "invalid_type", "n"),
        ({"stream": "yes"}, 400, "invalid_type", "stream"),
        (
            {"stream": True, "stream_options": {"include_usage": 1}},
            400,
            "invalid_type",
            "stream_options.include_usage",
        ),
        ({"prompt_cache_retention": "forever"}, 400, "invalid_value", "prompt_cache_retention"),
        ({"reasoning_effort": "extreme"}, 400, "invalid_value", "reasoning_effort"),
        ({"enable_thinking": "yes"}, 400, "invalid_type", "enable_thinking"),
        ({"preserve_thinking": 1}, 400, "invalid_type", "preserve_thinking"),
        ({"chat_template_kwargs": [1]}, 400, "invalid_type", "chat_template_kwargs"),
        # capabilities ninfer cannot provide (response_format JSON: tests/api/test_output_constraints.py)
        ({"response_format": {"type": "yaml"}}, 400, "invalid_value", "response_format.type"),
        ({"logit_bias": {"15": 0, "99": 5}}, 400, "unsupported_value", "logit_bias.99"),
        ({"logit_bias": {"15": 101}}, 400, "invalid_value", "logit_bias.15"),
        ({"logit_bias": [1]}, 400, "invalid_type", "logit_bias"),
        # keys are token ids: a non-integer key is malformed even with a neutral bias
        ({"logit_bias": {"hello": 0}}, 400, "invalid_value", "logit_bias.hello"),
        ({"logit_bias": {"-5": 0}}, 400, "invalid_value", "logit_bias.-5"),
        ({"logprobs": "yes"}, 400, "invalid_type", "logprobs"),
        ({"top_logprobs": 3}, 400, "invalid_value", "top_logprobs"),  # needs logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, 400, "invalid_value", "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, 400, "invalid_value", "top_logprobs"),
        ({"n_probs": 21}, 400, "invalid_value", "n_probs"),
        ({"modalities": ["text", "audio"]}, 400, "unsupported_value", "modalities[1]"),
        ({"web_search_options": {}}, 400, "unsupported_parameter", "web_search_options"),
        ({"moderation": True}, 400, "unsupported_parameter", "moderation"),
        ({"verbosity": "low"}, 400, "unsupported_value", "verbosity"),
        ({"verbosity": "high"}, 400, "unsupported_value", "verbosity"),
        ({"verbosity": "loud"}, 400, "invalid_value", "verbosity"),
        ({"store": True}, 400, "unsupported_value", "store"),
        ({"functions": [{"name": "f"}]}, 400, "unsupported_parameter", "functions"),
        ({"function_call": {"name": "f"}}, 400, "unsupported_value", "function_call"),
        ({"json_schema": "x"}, 400, "invalid_type", "json_schema"),
        ({"structured_outputs": {"json": 3}}, 400, "invalid_type", "structured_outputs.json"),
        ({"guided_json": "{not json"}, 400, "invalid_value", "guided_json"),
        ({"guided_regex": ""}, 400, "invalid_type", "guided_regex"),
        ({"guided_choice": []}, 400, "invalid_value", "guided_choice"),
        ({"guided_grammar": 7}, 400, "invalid_type", "guided_grammar"),
        ({"repetition_penalty": 1.1}, 400, "unsupported_value", "repetition_penalty"),
        (
            {"mm_processor_kwargs": {"fps": 2}},
            400,
            "unsupported_parameter",
            "mm_processor_kwargs.fps",
        ),
    ],
)
def test_rejections(fields, status, code, param):
    check_rejection(fields, status, code, param)


@pytest.mark.parametrize(
    ("fields", "guarantee"),
    [
        ({"store": True}, "stored"),
        ({"modalities": ["audio"]}, "audio output"),
    ],
)
def test_capability_rejections_name_the_guarantee(fields, guarantee):
    assert guarantee in reject(body(**fields)).message


# -- JSON body ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[1, 2]", b'"text"', b'{"temperature": NaN}', b'{"x": Infinity}', b"\xff\xfe{}"],
)
def test_bodies_that_are_not_one_json_object(raw):
    with pytest.raises(ApiError) as e:
        parse_json_object(raw)
    assert (e.value.status, e.value.code) == (400, "invalid_json")


def test_lone_surrogate_escapes_are_refused_by_field():
    ok = parse_json_object(b'{"a": "\\ud83d\\ude00 \\\\ud800"}')  # a pair; an escaped backslash
    assert ok == {"a": "\U0001f600 \\ud800"}
    for raw, param in [
        (b'{"messages": [{"role": "user", "content": "x\\ud800"}]}', "messages[0].content"),
        (b'{"metadata": {"\\udc00": "v"}}', "metadata"),
        (b'{"stop": ["ok", "\\uDBFF"]}', "stop[1]"),
    ]:
        with pytest.raises(ApiError) as e:
            parse_json_object(raw)
        assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_value", param)

"""Responses create / input-token request validation: accepted fields and their normalized
values, and every rejection with its status, code and field."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.responses.request import parse_count_request, parse_create_request
from ninfer.api.wire.errors import ApiError

MODEL = "tiny-model"
FN = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def parse(**fields: Any):
    return parse_create_request(
        {"model": MODEL, "input": "hi", **fields}, model_id=MODEL, vision=False
    )


def reject(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(**fields)
    return e.value


def test_log_probabilities_are_asked_by_include_or_top_logprobs():
    assert parse().logprobs is None and parse(top_logprobs=0).logprobs is None
    assert parse(include=["message.output_text.logprobs"]).logprobs == 0
    assert parse(include=["message.output_text.logprobs"], top_logprobs=5).logprobs == 5
    assert parse(top_logprobs=2).logprobs == 2


def test_defaults():
    r = parse()
    assert r.store and not r.stream and r.parallel_tool_calls and r.tool_choice == "auto"
    assert r.max_output_tokens is None and r.temperature is None and r.metadata == {}
    assert r.prompt_cache_mode == "implicit" and len(r.input_items) == 1


def test_neutral_and_advisory_fields_are_accepted():
    r = parse(
        instructions="x", max_output_tokens=0, stream=True, store=False, temperature=0.5, top_p=0.9,
        metadata={"a": "b"}, client_metadata={"trace": 1}, reasoning={"effort": "none", "summary": "auto"},
        chat_template_kwargs={"foo": 1}, preserve_thinking=True, text={"format": {"type": "text"}, "verbosity": "medium"},
        max_tool_calls=3, truncation="disabled", top_logprobs=0, service_tier="auto", background=False, include=[],
        stream_options={"include_obfuscation": False}, prompt_cache_key="k", prompt_cache_retention="24h",
        prompt_cache_options={"mode": "explicit", "ttl": "30m"}, safety_identifier="s", user="u",
        conversation=None,
    )  # fmt: skip
    assert r.stream and not r.store and r.max_output_tokens == 0 and r.reasoning_effort == "none"
    assert (
        r.prompt_cache_mode == "explicit" and r.preserve_thinking is True and r.max_tool_calls == 3
    )


def test_tools_namespaces_and_allowed_tools():
    ns = {
        "type": "namespace",
        "name": "mcp__w",
        "description": "d",
        "tools": [{"type": "function", "name": "get_weather"}],
    }
    r = parse(tools=[FN, ns], tool_choice={"type": "allowed_tools", "mode": "auto",
              "tools": [{"type": "function", "name": "get_weather", "namespace": "mcp__w"}]})  # fmt: skip
    assert [(f.namespace, f.name, f.internal) for f in r.tools.functions] == [
        (None, "get_weather", "get_weather"),
        ("mcp__w", "get_weather", "mcp__w__get_weather"),
    ]
    assert [f.internal for f in r.callable_functions] == ["mcp__w__get_weather"]
    assert parse(tools=[FN], tool_choice="none").callable_functions == ()
    assert (
        parse(tools=[FN], tool_choice="none", parallel_tool_calls=False).parallel_tool_calls
        is False
    )


@pytest.mark.parametrize(
    "fields, code, param",
    [
        ({"frobnicate": 1}, "unknown_parameter", "frobnicate"),
        ({"stop": ["x"]}, "unknown_parameter", "stop"),
        ({"reasoning": {"effort": "high", "budget": 3}}, "unknown_parameter", "reasoning.budget"),
        ({"conversation": {"id": "c"}}, "unsupported_parameter", "conversation"),
        ({"prompt": {"id": "p"}}, "unsupported_parameter", "prompt"),
        ({"context_management": [{"type": "compaction"}]}, "unsupported_parameter", "context_management"),
        ({"moderation": {"model": "m"}}, "unsupported_parameter", "moderation"),
        ({"background": True}, "unsupported_value", "background"),
        ({"include": ["file_search_call.results"]}, "unsupported_value", "include[0]"),
        ({"text": {"format": {"type": "yaml"}}}, "invalid_value", "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "schema": 3}}}, "invalid_type", "text.format.schema"),
        ({"text": {"verbosity": "low"}}, "unsupported_value", "text.verbosity"),
        ({"truncation": "auto"}, "unsupported_value", "truncation"),
        ({"top_logprobs": 21}, "invalid_value", "top_logprobs"),
        ({"service_tier": "flex"}, "unsupported_value", "service_tier"),
        ({"temperature": 2.5}, "invalid_value", "temperature"),
        ({"top_p": -0.1}, "invalid_value", "top_p"),
        ({"max_output_tokens": -1}, "invalid_value", "max_output_tokens"),
        ({"store": "yes"}, "invalid_type", "store"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "invalid_value", "metadata"),
        ({"metadata": {"k": "v" * 513}}, "invalid_value", "metadata.k"),
        ({"metadata": {"k": 1}}, "invalid_type", "metadata.k"),
        ({"reasoning": {"effort": "huge"}}, "invalid_value", "reasoning.effort"),
        ({"reasoning": {"summary": "detailed"}}, "unsupported_value", "reasoning.summary"),
        ({"reasoning": {"generate_summary": "concise"}}, "unsupported_value", "reasoning.generate_summary"),
        ({"prompt_cache_options": {"prewarm": True}}, "unsupported_value", "prompt_cache_options.prewarm"),
        ({"tools": [{"type": "web_search"}]}, "unsupported_value", "tools[0].type"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "unsupported_value", "tools[0].type"),
        ({"tools": [{"type": "custom", "name": "x"}]}, "unsupported_value", "tools[0].type"),
        ({"tools": [dict(FN, strict=1)]}, "invalid_type", "tools[0].strict"),
        ({"tools": [dict(FN, defer_loading=True)]}, "unsupported_value", "tools[0].defer_loading"),
        ({"tools": [dict(FN, output_schema={"type": "string"})]}, "unsupported_parameter", "tools[0].output_schema"),
        ({"tools": [dict(FN, allowed_callers=["programmatic"])]}, "unsupported_value", "tools[0].allowed_callers"),
        ({"tools": [FN, FN]}, "invalid_value", "tools[1].name"),
        ({"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "custom", "name": "c"}]}]}, "unsupported_value", "tools[0].tools[0].type"),
        ({"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "namespace", "name": "m", "tools": []}]}]}, "invalid_value", "tools[0].tools[0].type"),
        ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
        ({"tools": [FN], "tool_choice": {"type": "function", "name": "zzz"}}, "invalid_value", "tool_choice.name"),
        ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []}}, "invalid_value", "tool_choice.tools"),
        ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "zzz"}]}}, "invalid_value", "tool_choice.tools[0]"),
        ({"tools": [FN], "parallel_tool_calls": False}, "unsupported_value", "parallel_tool_calls"),
        ({"model": ""}, "invalid_value", "model"),
    ],
)  # fmt: skip
def test_rejections(fields, code, param):
    e = reject(**fields)
    assert (e.status, e.code, e.param) == (400, code, param)


def test_wrong_model_is_404():
    e = reject(model="other")
    assert (e.status, e.code) == (404, "model_not_found")


def test_count_request_accepts_only_prompt_fields():
    r = parse_count_request({"model": MODEL, "input": "x", "tools": [FN], "preserve_thinking": True,
                             "reasoning": {"effort": "low"}, "truncation": "disabled"}, model_id=MODEL, vision=False)  # fmt: skip
    assert r.reasoning_effort == "low" and r.preserve_thinking is True
    with pytest.raises(ApiError) as e:
        parse_count_request(
            {"model": MODEL, "input": "x", "max_output_tokens": 5}, model_id=MODEL, vision=False
        )
    assert (e.value.code, e.value.param) == ("unknown_parameter", "max_output_tokens")

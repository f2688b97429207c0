"""Anthropic Messages request options (no engine): capability refusals naming the field,
advisory fields, tool conversion, sampling, stop sequences, max_tokens and thinking."""

from __future__ import annotations

import json

import pytest

from ninfer.api.service.template_options import ThinkingDefaults
from tests.api.test_anthropic_request import (
    DEFAULT_MAX,
    WEATHER,
    assistant,
    parse,
    refused,
    text,
    user,
)

# -- capability rejections ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "block, what",
    [
        (
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "x"},
            },
            "document",
        ),
        ({"type": "search_result", "source": "s", "title": "t", "content": []}, "search result"),
        ({"type": "container_upload", "file_id": "f"}, "container"),
    ],
)
def test_user_blocks_needing_absent_capabilities(block, what):
    err = refused({"messages": [user([block])]}, "unsupported_value", "messages[0].content[0].type")
    assert what in err.message


@pytest.mark.parametrize(
    "block, what",
    [
        ({"type": "redacted_thinking", "data": "enc"}, "redacted-thinking"),
        (
            {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
            "server tools",
        ),
        (
            {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
            "server-tool results",
        ),
    ],
)
def test_assistant_blocks_needing_absent_capabilities(block, what):
    err = refused(
        {"messages": [user("q"), assistant([block, text("a")]), user("more")]},
        "unsupported_value",
        "messages[1].content[0].type",
    )
    assert what in err.message


@pytest.mark.parametrize(
    "body, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        (
            {
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
                "tools": [WEATHER],
            },
            "tool_choice.disable_parallel_tool_use",
        ),
        ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
        (
            {"tools": [{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]},
            "tools[0].allowed_callers",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"tools": [{"type": "mcp_toolset", "mcp_server_name": "x"}]}, "tools[0].type"),
        (
            {
                "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
                "max_tokens": 4096,
            },
            "thinking.display",
        ),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, "thinking.display"),
    ],
)
def test_unsupported_values(body, param):
    refused(body, "unsupported_value", param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"container": "cntr_1"}, "container"),
    ],
)
def test_unsupported_parameters(body, param):
    refused(body, "unsupported_parameter", param)


def test_advisory_and_unknown_fields_are_accepted():
    req = parse(
        {
            "metadata": {"user_id": "u1"},
            "service_tier": "auto",
            "inference_geo": "us",
            "speed": "standard",
            "some_future_field": {"x": 1},
            "tool_choice": {"type": "none", "disable_parallel_tool_use": True},
            "tools": [
                {**WEATHER, "input_examples": [{"city": "Oslo"}], "eager_input_streaming": True}
            ],
        }
    )
    assert req.tool_choice == "none" and not req.generation_request().parse_tools
    fn = req.tools[0]["function"]
    assert list(fn) == ["name", "description", "parameters", "input_examples"]
    assert fn["parameters"] is not None and fn["input_examples"] == [{"city": "Oslo"}]


def test_tool_conversion_keeps_schema_member_order():
    schema = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}
    req = parse({"tools": [{"name": "t", "input_schema": schema}]})
    assert req.tools == ({"type": "function", "function": {"name": "t", "parameters": schema}},)
    assert json.dumps(req.tools[0]["function"]["parameters"]) == json.dumps(schema)
    refused(
        {"tools": [{"name": "t", "input_schema": {"type": "array"}}]},
        "invalid_value",
        "tools[0].input_schema.type",
    )
    refused({"tools": [WEATHER, WEATHER]}, "invalid_value", "tools[1].name")


# -- sampling, output and thinking --------------------------------------------------------------


def test_sampling_stop_and_max_tokens():
    req = parse(
        {
            "max_tokens": 77,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 7,
            "stop_sequences": ["END", "###"],
            "stream": True,
        }
    )
    assert (req.max_tokens, req.stop, req.stream) == (77, ("END", "###"), True)
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k) == (0.5, 0.9, 7)
    refused({"temperature": 1.5}, "invalid_value", "temperature")
    refused({"top_k": 21}, "invalid_value", "top_k")  # as Chat: the sampler keeps at most 20
    refused({"max_tokens": -1}, "invalid_value", "max_tokens")
    refused({"stop_sequences": "END"}, "invalid_type", "stop_sequences")
    refused({"stop_sequences": [""]}, "invalid_value")
    many = [f"STOP{i}" for i in range(12)]  # the Messages API sets no limit (Chat: four)
    assert parse({"stop_sequences": many}).stop == tuple(many)
    refused({"model": ""}, "invalid_value", "model")


def test_thinking_modes():
    assert parse({"thinking": {"type": "disabled"}}).template_options.enable_thinking is False
    adaptive = parse({"thinking": {"type": "adaptive", "display": "summarized"}})
    assert adaptive.template_options.enable_thinking is True and adaptive.thinking_budget is None
    enabled = parse({"max_tokens": 3000, "thinking": {"type": "enabled", "budget_tokens": 2000}})
    assert enabled.template_options.enable_thinking is True
    assert enabled.generation_request().thinking_budget == 2000
    omitted = parse({}, thinking_defaults=ThinkingDefaults(enable_thinking=False))
    assert omitted.template_options.enable_thinking is False  # --no-thinking applies
    refused(
        {"max_tokens": 3000, "thinking": {"type": "enabled", "budget_tokens": 1023}},
        "invalid_value",
        "thinking.budget_tokens",
    )
    refused(
        {"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}},
        "invalid_value",
        "thinking.budget_tokens",
    )
    # budget >= --default-max-tokens when max_tokens is omitted
    refused(
        {"thinking": {"type": "enabled", "budget_tokens": DEFAULT_MAX + 1024}},
        "invalid_value",
        "thinking.budget_tokens",
    )
    refused(
        {"thinking": {"type": "enabled"}, "max_tokens": 4000},
        "missing_required_parameter",
        "thinking.budget_tokens",
    )
    refused({"thinking": {"type": "sometimes"}}, "invalid_value", "thinking.type")
    err = refused(
        {"thinking": {"type": "adaptive", "budget_tokens": 2048}, "max_tokens": 4000},
        "invalid_value",
        "thinking.budget_tokens",
    )
    assert "adaptive" in err.message  # it was accepted and the budget silently ignored


def test_effort_reaches_the_template_and_conflicts_are_reported():
    req = parse({"output_config": {"effort": "high"}})
    assert req.template_options.reasoning_effort == "high"
    assert req.template_options.variables()["reasoning_effort"] == "high"
    refused({"output_config": {"effort": "extreme"}}, "invalid_value", "output_config.effort")
    # Anthropic's effort is not a thinking switch: it stays with thinking disabled
    off = parse({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}})
    assert off.template_options.enable_thinking is False
    assert off.template_options.reasoning_effort == "high"
    # conflicts name Anthropic's fields, not Chat's
    err = refused(
        {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True}},
        "conflicting_template_option",
        "thinking.type",
    )
    assert "thinking.type" in err.message and "reasoning_effort" not in err.message
    # thinking.type is a string: the message names the boolean it stands for
    assert "thinking.type sets enable_thinking false" in err.message, err.message
    refused(
        {"output_config": {"effort": "low"}, "chat_template_kwargs": {"reasoning_effort": "max"}},
        "conflicting_template_option",
        "output_config.effort",
    )


def test_context_management_only_the_no_op_edit_is_accepted():
    keep_all = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    assert parse({"context_management": keep_all}).messages == parse({}).messages
    parse({"context_management": {"edits": []}})
    parse({"context_management": keep_all}, count_only=True)
    err = refused(
        {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        "unsupported_value",
        "context_management.edits[0].type",
    )
    assert "context editing" in err.message
    refused(
        {
            "context_management": {
                "edits": [
                    {"type": "clear_thinking_20251015", "keep": "all"},
                    {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns"}},
                ]
            }
        },
        "unsupported_value",
        "context_management.edits[1].keep",
    )
    refused({"context_management": "all"}, "invalid_type", "context_management")


def test_count_only_ignores_output_fields():
    req = parse(
        {
            "max_tokens": 0,
            "temperature": 9,
            "stop_sequences": 5,
            "stream": "yes",
            "thinking": {"type": "enabled", "budget_tokens": 100000},
        },
        count_only=True,
    )
    assert req.thinking_budget == 100000 and not req.stream

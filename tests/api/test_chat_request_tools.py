"""Chat Completions request parsing: function tools, tool_choice (auto, none, allowed_tools)
and parallel_tool_calls — normalization and every rejection with its field."""

from __future__ import annotations

import pytest

from ninfer.api.chat.request import FunctionTool
from tests.api.chat_request_helpers import CLOCK, WEATHER, body, check_rejection, parse

# -- rejections ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        (
            {"tools": [{**WEATHER, "function": {**WEATHER["function"], "strict": "yes"}}]},
            400,
            "invalid_type",
            "tools[0].function.strict",
        ),
        ({"tools": [{"type": "web_search"}]}, 400, "unsupported_value", "tools[0].type"),
        (
            {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
            400,
            "unsupported_value",
            "tools[0].type",
        ),
        ({"tools": [{"type": "function"}]}, 400, "missing_required_parameter", "tools[0].function"),
        (
            {"tools": [{"type": "function", "function": {"name": ""}}]},
            400,
            "invalid_value",
            "tools[0].function.name",
        ),
        ({"tools": [WEATHER, WEATHER]}, 400, "invalid_value", "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
            400,
            "invalid_type",
            "tools[0].function.parameters",
        ),
        ({"tool_choice": "required"}, 400, "invalid_value", "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            400,
            "invalid_value",
            "tool_choice.function.name",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, 400, "invalid_value", "tool_choice"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "sometimes", "tools": []},
                },
            },
            400,
            "invalid_value",
            "tool_choice.allowed_tools.mode",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {
                        "mode": "auto",
                        "tools": [{"type": "function", "function": {"name": "nope"}}],
                    },
                },
            },
            400,
            "invalid_value",
            "tool_choice.allowed_tools.tools[0]",
        ),
        (
            {"tools": [WEATHER], "parallel_tool_calls": False},
            400,
            "unsupported_value",
            "parallel_tool_calls",
        ),
    ],
)
def test_tool_rejections(fields, status, code, param):
    check_rejection(fields, status, code, param)


# -- tools and tool choice ----------------------------------------------------------------------


def test_tools_are_normalized_in_declaration_order():
    r = parse(body(tools=[WEATHER, CLOCK]))
    assert r.tools == (
        FunctionTool("get_weather", "Get the weather", WEATHER["function"]["parameters"]),
        FunctionTool("get_time"),
    )
    assert r.callable_tools == r.tools
    assert r.template_tools() == [WEATHER, CLOCK]


def test_strict_false_is_accepted():
    fn = {**WEATHER["function"], "strict": False}
    assert parse(body(tools=[{"type": "function", "function": fn}])).tools[0].name == "get_weather"


def test_tool_choice_none_disables_calls():
    r = parse(body(tools=[WEATHER, CLOCK], tool_choice="none"))
    assert r.tool_choice == "none" and r.callable_tools == () and len(r.tools) == 2


def test_allowed_tools_auto_filters_without_reordering():
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "auto",
            "tools": [
                {"type": "function", "function": {"name": "get_time"}},
                {"type": "function", "name": "get_weather"},
            ],
        },
    }
    r = parse(body(tools=[WEATHER, CLOCK], tool_choice=choice))
    assert r.allowed_tools == ("get_time", "get_weather")
    assert [t.name for t in r.callable_tools] == ["get_weather", "get_time"]
    only = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "auto",
            "tools": [{"type": "function", "function": {"name": "get_time"}}],
        },
    }
    r = parse(body(tools=[WEATHER, CLOCK], tool_choice=only, parallel_tool_calls=True))
    assert [t.name for t in r.callable_tools] == ["get_time"]
    assert len(r.tools) == 2  # every declared tool still reaches the prompt

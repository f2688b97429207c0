"""Chat Completions request parsing: `messages` (roles, history, content parts, names, tool
history) and prompt-cache hints — normalization and every rejection with its field."""

from __future__ import annotations

import json

import pytest

from ninfer.api.chat.request import ChatMessage, TextPart, ToolCall
from ninfer.api.wire.fields import parse_json_object
from tests.api.chat_request_helpers import DROP, USER, body, check_rejection, parse, reject

# -- rejections ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"messages": DROP}, 400, "missing_required_parameter", "messages"),
        ({"messages": []}, 400, "invalid_value", "messages"),
        ({"messages": "hi"}, 400, "invalid_type", "messages"),
        ({"messages": ["hi"]}, 400, "invalid_type", "messages[0]"),
        ({"messages": [{"content": "x"}]}, 400, "missing_required_parameter", "messages[0].role"),
        (
            {"messages": [{"role": "narrator", "content": "x"}]},
            400,
            "invalid_value",
            "messages[0].role",
        ),
        (
            {"messages": [{"role": "user"}]},
            400,
            "missing_required_parameter",
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "user", "content": 5}]},
            400,
            "invalid_type",
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            400,
            "missing_required_parameter",
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
            400,
            "invalid_value",
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]},
            400,
            "invalid_value",
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "tool", "content": "r"}]},
            400,
            "missing_required_parameter",
            "messages[0].tool_call_id",
        ),
        (
            {"messages": [{"role": "function", "content": "r"}]},
            400,
            "missing_required_parameter",
            "messages[0].name",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "name": "alice"}]},
            400,
            "unsupported_parameter",
            "messages[0].name",
        ),
        (
            {"messages": [{"role": "system", "content": "x", "name": "boss"}]},
            400,
            "unsupported_parameter",
            "messages[0].name",
        ),
        (
            {"messages": [{"role": "tool", "content": "r", "tool_call_id": "c", "name": 5}]},
            400,
            "invalid_type",
            "messages[0].name",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "name": 5}]},
            400,
            "invalid_type",
            "messages[0].name",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "x",
                        "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}],
                    }
                ]
            },
            400,
            "missing_required_parameter",
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "custom", "custom": {"name": "x", "input": "y"}}],
                    }
                ]
            },
            400,
            "unsupported_value",
            "messages[0].tool_calls[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": 5}}],
                    }
                ]
            },
            400,
            "invalid_type",
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "x",
                        "reasoning_content": "a",
                        "reasoning": "b",
                    }
                ]
            },
            400,
            "invalid_value",
            "messages[0].reasoning",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "audio": {"id": "a1"}}]},
            400,
            "unsupported_parameter",
            "messages[0].audio",
        ),
    ],
)
def test_message_rejections(fields, status, code, param):
    check_rejection(fields, status, code, param)


# -- messages -----------------------------------------------------------------------------------


def test_roles_order_and_history_are_kept():
    r = parse(
        body(
            messages=[
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "u1"},
                {"role": "developer", "content": "dev in the middle"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "think",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": "sunny",
                    "name": "get_weather",
                },
                {"role": "assistant", "content": "ok", "reasoning": "alias"},
                {
                    "role": "assistant",
                    "content": "",
                    "function_call": {"name": "get_time", "arguments": "{}"},
                },
                {"role": "function", "name": "get_time", "content": "noon"},
                {"role": "user", "content": ""},
            ]
        )
    )
    roles = [m.role for m in r.messages]
    assert roles == [
        "system",
        "user",
        "developer",
        "assistant",
        "tool",
        "assistant",
        "assistant",
        "tool",
        "user",
    ]
    call = r.messages[3]
    assert call.reasoning_content == "think" and call.parts == ()
    assert call.tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    assert (
        r.messages[4].tool_call_id == "call_1" and r.messages[4].name is None
    )  # tool name ignored
    assert r.messages[5].reasoning_content == "alias"
    assert r.messages[6].tool_calls == (ToolCall(None, "get_time", "{}"),)
    assert r.messages[7] == ChatMessage("tool", (TextPart("noon"),), name="get_time")
    assert r.messages[8] == ChatMessage("user", ())  # empty content: an empty turn
    t = r.template_messages()
    assert t[3] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "think",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                "id": "call_1",
            }
        ],
    }
    assert t[7] == {"role": "tool", "content": "noon", "name": "get_time"}
    assert t[8] == {"role": "user", "content": ""}


def test_text_and_refusal_parts_concatenate_without_separators():
    r = parse(
        body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "text", "text": ""},
                        {"type": "text", "text": "b\n"},
                        {"type": "text", "text": "c"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "x"},
                        {"type": "refusal", "refusal": "no"},
                    ],
                    "refusal": "!",
                },
            ]
        )
    )
    assert r.messages[0].text == "ab\nc"
    assert r.template_messages()[0]["content"] == "ab\nc"
    assert r.messages[1].text == "xno!"


def test_empty_names_on_other_roles_are_accepted():
    r = parse(
        body(
            messages=[
                {"role": "user", "content": "x", "name": ""},
                {"role": "assistant", "content": "y", "name": None},
            ]
        )
    )
    assert [m.name for m in r.messages] == [None, None]


def test_tool_call_arguments_given_as_an_object_keep_member_order():
    args = {"zeta": 1, "alpha": {"y": 2, "b": 3}}
    r = parse(
        body(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}],
                },
            ]
        )
    )
    assert r.messages[1].tool_calls[0].arguments == '{"zeta": 1, "alpha": {"y": 2, "b": 3}}'


def test_tool_schemas_keep_member_order_through_json_parsing():
    raw = (
        '{"model": "tiny-model", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",'
        ' "function": {"name": "f", "parameters": {"type": "object", "properties":'
        ' {"zz": {"type": "string"}, "aa": {"type": "integer"}, "mm": {"type": "boolean"}}}}}]}'
    )
    r = parse(parse_json_object(raw.encode()))
    props = r.tools[0].parameters["properties"]
    assert list(props) == ["zz", "aa", "mm"]
    assert json.dumps(r.template_tools()[0]["function"]["parameters"]).index('"zz"') < json.dumps(
        r.template_tools()
    ).index('"aa"')


# -- prompt cache hints -------------------------------------------------------------------------


def test_explicit_cache_breakpoints_mark_their_parts():
    content = [
        {"type": "text", "text": "long document", "prompt_cache_breakpoint": {"mode": "explicit"}},
        {"type": "text", "text": "question"},
    ]
    r = parse(body(messages=[{"role": "user", "content": content}]))
    assert r.messages[0].parts == (TextPart("long document", True), TextPart("question"))


def test_only_the_latest_four_explicit_breakpoints_are_write_candidates():
    marked = {"type": "text", "text": "m", "prompt_cache_breakpoint": {"mode": "explicit"}}
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": [marked]} for i in range(6)]
    msgs.insert(3, {"role": "user", "content": "unmarked"})
    r = parse(body(messages=msgs))
    assert [p.message for p in r.explicit_cache_points] == [2, 4, 5, 6]
    assert {p.offset for p in r.explicit_cache_points} == {1}  # the end of the marked part
    assert parse(body()).explicit_cache_points == ()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt_cache_options": {"mode": "always"}}, "prompt_cache_options.mode"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "text",
                                "text": "x",
                                "prompt_cache_breakpoint": {"mode": "auto"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].prompt_cache_breakpoint.mode",
        ),
        ({"prompt_cache_key": 5}, "prompt_cache_key"),
    ],
)
def test_malformed_cache_hints(fields, param):
    assert reject(body(**fields)).param == param

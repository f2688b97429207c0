"""Chat Completions request parsing and validation: what is accepted and how it is normalized,
and every rejection with its status, code and field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ninfer.api.errors import ApiError
from ninfer.api.fields import parse_json_object
from ninfer.api.openai_chat_models import (
    ChatMessage,
    ChatRequest,
    FunctionTool,
    MediaPart,
    TextPart,
    ToolCall,
    parse_chat_request,
)

MODEL = "tiny-model"
USER = {"role": "user", "content": "hi"}


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "messages": [USER]}
    out.update(fields)
    return {k: v for k, v in out.items() if v is not _DROP}


_DROP = object()


def parse(b: dict[str, Any], *, vision: bool = False) -> ChatRequest:
    return parse_chat_request(b, model_id=MODEL, vision=vision)


def reject(b: dict[str, Any], *, vision: bool = False) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(b, vision=vision)
    return e.value


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


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
        ({"logprobs": False, "top_logprobs": 0}, lambda r: True),
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
        ({"grammar": None, "guided_json": None}, lambda r: True),
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
        # model and messages
        ({"model": "other"}, 404, "model_not_found", "model"),
        ({"model": _DROP}, 400, "missing_required_parameter", "model"),
        ({"model": ""}, 400, "invalid_value", "model"),
        ({"model": 3}, 400, "invalid_type", "model"),
        ({"messages": _DROP}, 400, "missing_required_parameter", "messages"),
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
        ({"n": 2}, 400, "unsupported_value", "n"),
        ({"n": 0}, 400, "invalid_value", "n"),
        ({"stream": "yes"}, 400, "invalid_type", "stream"),
        (
            {"stream_options": {"include_usage": 1}},
            400,
            "invalid_type",
            "stream_options.include_usage",
        ),
        ({"reasoning_effort": "extreme"}, 400, "invalid_value", "reasoning_effort"),
        ({"enable_thinking": "yes"}, 400, "invalid_type", "enable_thinking"),
        ({"preserve_thinking": 1}, 400, "invalid_type", "preserve_thinking"),
        ({"chat_template_kwargs": [1]}, 400, "invalid_type", "chat_template_kwargs"),
        # capabilities ninfer cannot provide
        (
            {"response_format": {"type": "json_object"}},
            400,
            "unsupported_value",
            "response_format.type",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}},
                }
            },
            400,
            "unsupported_value",
            "response_format.type",
        ),
        ({"response_format": {"type": "yaml"}}, 400, "invalid_value", "response_format.type"),
        ({"logit_bias": {"15": 0, "99": 5}}, 400, "unsupported_value", "logit_bias.99"),
        ({"logit_bias": {"15": 101}}, 400, "invalid_value", "logit_bias.15"),
        ({"logit_bias": [1]}, 400, "invalid_type", "logit_bias"),
        ({"logprobs": True}, 400, "unsupported_value", "logprobs"),
        ({"top_logprobs": 3}, 400, "unsupported_value", "top_logprobs"),
        ({"modalities": ["text", "audio"]}, 400, "unsupported_value", "modalities[1]"),
        ({"web_search_options": {}}, 400, "unsupported_parameter", "web_search_options"),
        ({"moderation": True}, 400, "unsupported_parameter", "moderation"),
        ({"verbosity": "low"}, 400, "unsupported_value", "verbosity"),
        ({"verbosity": "high"}, 400, "unsupported_value", "verbosity"),
        ({"verbosity": "loud"}, 400, "invalid_value", "verbosity"),
        ({"store": True}, 400, "unsupported_value", "store"),
        ({"functions": [{"name": "f"}]}, 400, "unsupported_parameter", "functions"),
        ({"function_call": {"name": "f"}}, 400, "unsupported_value", "function_call"),
        ({"grammar": "root ::= x"}, 400, "unsupported_parameter", "grammar"),
        ({"structured_outputs": {"json": {}}}, 400, "unsupported_parameter", "structured_outputs"),
        ({"guided_json": {"type": "object"}}, 400, "unsupported_parameter", "guided_json"),
        ({"guided_regex": "a+"}, 400, "unsupported_parameter", "guided_regex"),
        ({"guided_choice": ["a", "b"]}, 400, "unsupported_parameter", "guided_choice"),
        ({"guided_grammar": "g"}, 400, "unsupported_parameter", "guided_grammar"),
        ({"repetition_penalty": 1.1}, 400, "unsupported_value", "repetition_penalty"),
        (
            {"mm_processor_kwargs": {"fps": 2}},
            400,
            "unsupported_parameter",
            "mm_processor_kwargs.fps",
        ),
        # tools
        (
            {"tools": [{**WEATHER, "function": {**WEATHER["function"], "strict": True}}]},
            400,
            "unsupported_value",
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
        ({"tools": [WEATHER], "tool_choice": "required"}, 400, "unsupported_value", "tool_choice"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
            400,
            "unsupported_value",
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, 400, "invalid_value", "tool_choice"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "required", "tools": []},
                },
            },
            400,
            "unsupported_value",
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
def test_rejections(fields, status, code, param):
    err = reject(body(**fields))
    assert (err.status, err.code, err.param) == (status, code, param), err
    assert param.split("[")[0].split(".")[0] in err.message
    assert "\n" not in err.message
    assert err.body() == {
        "error": {"message": err.message, "type": err.type, "param": param, "code": code}
    }


@pytest.mark.parametrize(
    ("fields", "guarantee"),
    [
        ({"response_format": {"type": "json_object"}}, "constrained"),
        ({"logprobs": True}, "log probabilities"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "forced tool call"),
        ({"grammar": "g"}, "constrained"),
        ({"store": True}, "stored"),
        ({"modalities": ["audio"]}, "audio output"),
    ],
)
def test_capability_rejections_name_the_guarantee(fields, guarantee):
    assert guarantee in reject(body(**fields)).message


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


# -- media --------------------------------------------------------------------------------------

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
VIDEO = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}


@pytest.mark.parametrize(
    "part", [IMAGE, VIDEO, {"type": "image_url", "image_url": "https://example.com/b.png"}]
)
def test_media_without_vision_is_vision_disabled(part):
    err = reject(
        body(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, part]}])
    )
    assert (err.status, err.code, err.param) == (400, "vision_disabled", "messages[0].content[1]")
    assert "--vision" in err.message


def test_media_with_vision_is_kept_in_order():
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                IMAGE,
                {"type": "text", "text": "b"},
                {"type": "text", "text": "c"},
                VIDEO,
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "image_url", "image_url": "data:image/png;base64,AA"}],
        },
    ]
    r = parse(body(messages=msgs), vision=True)
    assert r.has_media
    assert r.messages[0].parts == (
        TextPart("a"), MediaPart("image", "https://example.com/a.png"), TextPart("b"), TextPart("c"),
        MediaPart("video", "data:video/mp4;base64,AAAA"),
    )  # fmt: skip
    assert r.template_messages()[0]["content"] == [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "bc"}, {"type": "video"},
    ]  # fmt: skip
    assert r.messages[1].media == (MediaPart("image", "data:image/png;base64,AA"),)


@pytest.mark.parametrize(
    ("part", "role", "code", "param"),
    [
        (
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].image_url.detail",
        ),
        (
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].image_url.detail",
        ),
        (
            {"type": "image_url", "image_url": {"url": "ftp://x/a.png"}},
            "user",
            "invalid_media",
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "image_url", "image_url": "file:///etc/passwd"},
            "user",
            "invalid_media",
            "messages[0].content[0].image_url",
        ),
        (
            {"type": "image_url", "image_url": {}},
            "user",
            "missing_required_parameter",
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].type",
        ),
        (
            {"type": "file", "file": {"file_id": "f"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].type",
        ),
        (IMAGE, "system", "invalid_value", "messages[0].content[0].type"),
        (VIDEO, "tool", "invalid_value", "messages[0].content[0].type"),
    ],
)
def test_media_rejections(part, role, code, param):
    msg: dict[str, Any] = {"role": role, "content": [part]}
    if role == "tool":
        msg["tool_call_id"] = "c"
    err = reject(body(messages=[msg]), vision=True)
    assert (err.status, err.code, err.param) == (400, code, param)


def test_image_detail_auto_is_accepted():
    part = {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "auto"}}
    assert parse(body(messages=[{"role": "user", "content": [part]}]), vision=True).has_media


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
    assert r.explicit_cache_messages == (2, 4, 5, 6)
    assert parse(body()).explicit_cache_messages == ()


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


# -- JSON body ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[1, 2]", b'"text"', b'{"temperature": NaN}', b'{"x": Infinity}', b"\xff\xfe{}"],
)
def test_bodies_that_are_not_one_json_object(raw):
    with pytest.raises(ApiError) as e:
        parse_json_object(raw)
    assert (e.value.status, e.value.code) == (400, "invalid_json")


def test_reasoning_efforts_match_the_template_layer():
    from ninfer.api import template
    from ninfer.api.openai_chat_models import REASONING_EFFORTS

    assert REASONING_EFFORTS == template.REASONING_EFFORTS

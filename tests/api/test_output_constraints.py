"""The request fields that constrain the output, as each protocol's parser reads them (no
engine): which constraint a request carries, that a request carries at most one, and the
refusals that remain."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.anthropic.request import parse_messages_request
from ninfer.api.chat.request import parse_chat_request
from ninfer.api.responses.request import parse_create_request
from ninfer.api.wire.errors import ApiError
from ninfer.constrain import ForcedToolCall, Grammar, JsonObject, JsonSchema, Regex, StrictTools

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def chat(**fields: Any):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(body, model_id="m", vision=False)


def responses(**fields: Any):
    return parse_create_request({"model": "m", "input": "hi", **fields}, model_id="m", vision=False)


def messages(**fields: Any):
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_messages_request(body, vision=False, default_max_tokens=64)


def chat_tool(name: str, strict: bool | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "parameters": PARAMS}
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}


def refused(parse, code: str, param: str, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    assert (info.value.status, info.value.code, info.value.param) == (400, code, param), info.value
    return info.value


# -- Chat Completions -------------------------------------------------------------------------


def test_chat_response_formats():
    assert chat().constraint is None
    assert chat(response_format={"type": "text"}).constraint is None
    assert chat(response_format={"type": "json_object"}).constraint == JsonObject("response_format")
    c = chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
        }
    ).constraint
    assert c == JsonSchema(SCHEMA, True, "response_format.json_schema.schema")
    loose = chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    assert loose.constraint.strict is False  # OpenAI's default


def test_chat_llama_cpp_fields():
    assert chat(json_schema=SCHEMA).constraint == JsonSchema(SCHEMA, False, "json_schema")
    assert chat(grammar='root ::= "a"').constraint == Grammar('root ::= "a"', "gbnf", "grammar")
    assert chat(grammar="").constraint is None  # llama.cpp: an empty grammar is none
    refused(chat, "conflicting_constraints", "grammar", json_schema=SCHEMA, grammar="root ::= x")


def test_chat_tool_choices():
    tools = [chat_tool("a"), chat_tool("b", strict=True)]
    assert chat(tools=[chat_tool("a")]).constraint is None  # auto, non-strict: free
    strict = chat(tools=tools).constraint
    assert isinstance(strict, StrictTools) and [t.strict for t in strict.tools] == [False, True]
    forced = chat(tools=tools, tool_choice="required").constraint
    assert isinstance(forced, ForcedToolCall) and forced.parallel
    assert [(t.name, t.strict, t.path) for t in forced.tools] == [
        ("a", True, "tools[0].function.parameters"),  # a forced call is always valid
        ("b", True, "tools[1].function.parameters"),
    ]
    named = chat(tools=tools, tool_choice={"type": "function", "function": {"name": "b"}})
    assert [t.name for t in named.constraint.tools] == ["b"] and not named.constraint.parallel
    assert [t.name for t in named.callable_tools] == ["b"]
    one = chat(tools=tools, tool_choice="required", parallel_tool_calls=False).constraint
    assert not one.parallel
    allowed = chat(
        tools=tools,
        tool_choice={
            "type": "allowed_tools",
            "allowed_tools": {"mode": "required", "tools": [{"type": "function", "name": "a"}]},
        },
    ).constraint
    assert [t.name for t in allowed.tools] == ["a"]
    assert chat(tools=tools, tool_choice="none").constraint is None
    # one call at most needs the grammar: refused when nothing constrains the output
    refused(
        chat, "unsupported_value", "parallel_tool_calls", tools=[chat_tool("a")],
        parallel_tool_calls=False,
    )  # fmt: skip


def test_chat_answer_format_with_tools():
    """A JSON format with tools under auto: that answer or calls (an agent with an output type
    and tools); under required only calls can come; a grammar cannot be combined."""
    fmt = {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": True}}
    either = chat(response_format=fmt, tools=[chat_tool("a")]).constraint
    assert isinstance(either, StrictTools)
    assert either.answer == JsonSchema(SCHEMA, True, "response_format.json_schema.schema")
    forced = chat(response_format=fmt, tools=[chat_tool("a")], tool_choice="required")
    assert isinstance(forced.constraint, ForcedToolCall)
    assert chat(response_format=fmt, tools=[chat_tool("a")], tool_choice="none").constraint == (
        JsonSchema(SCHEMA, True, "response_format.json_schema.schema")
    )
    refused(
        chat, "conflicting_constraints", "grammar",
        grammar='root ::= "a"', tools=[chat_tool("a", strict=True)],
    )  # fmt: skip


def test_chat_one_format_per_request():
    refused(
        chat, "conflicting_constraints", "json_schema",
        response_format={"type": "json_object"}, json_schema=SCHEMA,
    )  # fmt: skip


def test_vllm_spellings():
    assert chat(guided_json=SCHEMA).constraint == JsonSchema(SCHEMA, False, "guided_json")
    assert chat(guided_json='{"type": "integer"}').constraint.schema == {"type": "integer"}
    assert chat(structured_outputs={"regex": "[0-9]+"}).constraint == Regex(
        "[0-9]+", "structured_outputs.regex"
    )
    choice = chat(guided_choice=["yes", 'say "no"']).constraint
    assert choice == Grammar('start: "yes" | "say \\"no\\""', "lark", "guided_choice")
    assert chat(guided_grammar='root ::= "a"').constraint.syntax == "gbnf"
    assert chat(structured_outputs={"json_object": True}).constraint == JsonObject(
        "structured_outputs"
    )
    refused(
        chat, "unsupported_parameter", "structured_outputs.structural_tag",
        structured_outputs={"structural_tag": "{}"},
    )  # fmt: skip
    refused(
        chat, "conflicting_constraints", "guided_regex",
        response_format={"type": "json_object"}, guided_regex="a+",
    )  # fmt: skip
    refused(
        chat, "conflicting_constraints", "guided_regex",
        structured_outputs={"json": SCHEMA}, guided_regex="a+",
    )  # fmt: skip


# -- Responses --------------------------------------------------------------------------------


def test_responses_text_format_and_tools():
    fmt = {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}
    req = responses(text={"format": fmt})
    assert req.constraint == JsonSchema(SCHEMA, True, "text.format.schema")
    assert req.text_format_wire == fmt  # echoed in the Response object
    assert responses(text={"format": {"type": "json_object"}}).constraint == JsonObject(
        "text.format"
    )
    fn = {"type": "function", "name": "get", "parameters": PARAMS, "strict": True}
    strict = responses(tools=[fn]).constraint
    assert isinstance(strict, StrictTools) and strict.tools[0].path == "tools[0].parameters"
    named = responses(tools=[fn], tool_choice={"type": "function", "name": "get"})
    assert isinstance(named.constraint, ForcedToolCall) and named.tool_choice == "required"
    ns = {"type": "namespace", "name": "w", "tools": [dict(fn, strict=False)]}
    forced = responses(tools=[ns], tool_choice="required").constraint
    assert (
        forced.tools[0].name == "w__get" and forced.tools[0].path == "tools[0].tools[0].parameters"
    )
    both = responses(text={"format": fmt}, tools=[fn]).constraint
    assert isinstance(both, StrictTools) and both.answer.path == "text.format.schema"


# -- Anthropic Messages -----------------------------------------------------------------------

WEATHER = {"name": "get_weather", "input_schema": PARAMS}


def test_anthropic_structured_outputs_and_tool_choice():
    fmt = {"type": "json_schema", "schema": SCHEMA}
    assert messages(output_config={"format": fmt}).constraint == JsonSchema(
        SCHEMA, True, "output_config.format.schema"
    )
    assert messages(output_format=fmt).constraint.path == "output_format.schema"
    refused(
        messages, "conflicting_constraints", "output_format",
        output_format=fmt, output_config={"format": fmt},
    )  # fmt: skip
    anyone = messages(tools=[WEATHER], tool_choice={"type": "any"})
    assert isinstance(anyone.constraint, ForcedToolCall) and anyone.constraint.parallel
    assert anyone.generation_request().parse_tools
    named = messages(
        tools=[WEATHER, {**WEATHER, "name": "other"}],
        tool_choice={"type": "tool", "name": "other", "disable_parallel_tool_use": True},
    )
    assert [t.name for t in named.constraint.tools] == ["other"]
    assert [t["function"]["name"] for t in named.generation_request().callable_tools] == ["other"]
    strict = messages(tools=[{**WEATHER, "strict": True}]).constraint
    assert isinstance(strict, StrictTools) and strict.tools[0].path == "tools[0].input_schema"
    refused(messages, "invalid_value", "tool_choice.name", tools=[WEATHER],
            tool_choice={"type": "tool", "name": "nope"})  # fmt: skip
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]
    refused(messages, "conflicting_constraints", "messages", messages=prefill,
            output_config={"format": fmt})  # fmt: skip

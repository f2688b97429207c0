"""Qwen XML tool-call parsing: typed arguments, nested markup, lossless fallback, streaming."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.api.service.tool_params import convert_parameter, parameter_types
from ninfer.api.service.toolcalls import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallParser,
    ToolCallStart,
    parse_tool_calls,
)


def fn(name: str, props: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": props}},
    }


TOOLS = [
    fn(
        "get_weather",
        {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
    ),
    fn("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
    fn(
        "search",
        {
            "query": {"type": "string"},
            "filters": {"type": "object"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "tags": {"type": "array"},
            "score": {"type": "number"},
            "anything": {},
        },
    ),
    {
        "type": "function",
        "name": "responses_style",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
    {
        "name": "anthropic_style",
        "input_schema": {"type": "object", "properties": {"y": {"type": "string"}}},
    },
]


def call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(text: str, tools=TOOLS):
    return parse_tool_calls(text, tools, make_id=ids())


def args(text: str, tools=TOOLS) -> list[dict]:
    out = parse(text, tools)
    assert out.stats.fallback_reason == "none", out.stats
    return [json.loads(c.arguments) for c in out.calls]


def test_single_call_events_and_arguments() -> None:
    p = ToolCallParser(TOOLS, make_id=ids())
    text = "Let me check.\n\n" + call(
        "get_weather", ("city", "Paris"), ("days", "2"), ("metric", "True")
    )
    events = p.feed(text) + p.finish()
    assert events[0] == ContentDelta("Let me check.\n\n")
    assert events[1] == ToolCallStart(0, "call_0", "get_weather")
    deltas = [e.text for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert deltas == ['{"city": "Paris"', ', "days": 2', ', "metric": true}']
    end = events[-1]
    assert isinstance(end, ToolCallEnd) and end.call.arguments == "".join(deltas)
    assert json.loads(end.call.arguments) == {"city": "Paris", "days": 2, "metric": True}
    assert p.stats.as_dict() == {
        "marker_seen": True,
        "calls": 1,
        "empty_omitted": 0,
        "schema_mismatches": 0,
        "fallback_reason": "none",
    }


def test_content_streams_and_only_marker_prefix_is_held() -> None:
    p = ToolCallParser(TOOLS)
    assert p.feed("Hello <b>") == [ContentDelta("Hello <b>")]
    assert p.feed(" x <tool") == [ContentDelta(" x ")]
    assert p.content_held == "<tool"
    assert p.feed("box>") == [ContentDelta("<toolbox>")]
    assert p.feed("<tool_call>\n<function=get_weather>\n") == []  # region held
    assert p.feed("<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>") == []
    events = p.finish()
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArgumentsDelta, ToolCallEnd]


def test_multiple_calls_and_member_order() -> None:
    text = (
        call("search", ("query", "x"), ("filters", '{"z": 1, "a": {"k": [1, 2]}}'))
        + "\n"
        + call("get_weather", ("days", "3"), ("city", "Oslo"))
        + "\n"
    )
    out = parse(text)
    assert [c.name for c in out.calls] == ["search", "get_weather"]
    assert [c.id for c in out.calls] == ["call_0", "call_1"]
    assert out.calls[0].arguments == '{"query": "x", "filters": {"z": 1, "a": {"k": [1, 2]}}}'
    assert out.calls[1].arguments == '{"days": 3, "city": "Oslo"}'  # generated order kept
    assert out.content == ""


@pytest.mark.parametrize(
    "schema, text, expected",
    [
        ({"type": "string"}, "42", "42"),
        ({"type": "string"}, "", ""),
        ({"type": "string"}, '{"a": 1}', '{"a": 1}'),
        ({"type": ["string", "null"]}, "null", "null"),
        ({"type": "integer"}, "42", 42),
        ({"type": "integer"}, " 7 ", 7),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "number"}, "3", 3),
        ({"type": "boolean"}, "TRUE", True),
        ({"type": "boolean"}, "False", False),
        ({"type": "null"}, "null", None),
        ({"type": "object"}, '{"b": 1, "a": [true, null]}', {"b": 1, "a": [True, None]}),
        ({"type": "array"}, '[1, "x"]', [1, "x"]),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "5", 5),
        ({"oneOf": [{"type": "boolean"}, {"type": "integer"}]}, "true", True),
        ({}, "12", 12),  # untyped: JSON keeps its type
        ({}, "hello world", "hello world"),
        ({"anyOf": [{"$ref": "#/defs/x"}, {"type": "null"}]}, '{"k": 1}', {"k": 1}),  # untyped
        ({"description": "no type"}, "true", True),
        ({}, "", ""),
    ],
)
def test_typed_conversion(schema: dict, text: str, expected: object) -> None:
    conv = convert_parameter(text, parameter_types(schema))
    assert not conv.omitted and not conv.mismatch
    assert conv.value == expected and type(conv.value) is type(expected)


@pytest.mark.parametrize(
    "schema, text, expected",
    [
        ({"type": "integer"}, "1.5", 1.5),  # valid JSON keeps its type
        ({"type": "integer"}, '"7"', "7"),
        ({"type": "number"}, "twelve", "twelve"),  # other text becomes a string
        ({"type": "boolean"}, "yes", "yes"),
        ({"type": "object"}, "[1]", [1]),
        ({"type": "number"}, "NaN", "NaN"),  # not JSON
        ({"type": "number"}, "1e999", "1e999"),  # not a finite number
    ],
)
def test_schema_mismatch_is_kept(schema: dict, text: str, expected: object) -> None:
    conv = convert_parameter(text, parameter_types(schema))
    assert conv.mismatch and conv.value == expected and type(conv.value) is type(expected)


def test_empty_non_string_is_omitted_and_counted() -> None:
    out = parse(call("get_weather", ("city", ""), ("days", ""), ("metric", "  ")))
    assert json.loads(out.calls[0].arguments) == {"city": ""}
    assert out.stats.empty_omitted == 2 and out.stats.schema_mismatches == 0
    out = parse(call("search", ("limit", "many"), ("score", "[1]")))
    assert json.loads(out.calls[0].arguments) == {"limit": "many", "score": [1]}
    assert out.stats.schema_mismatches == 2


def test_tool_definition_styles() -> None:
    assert args(call("responses_style", ("x", "3"))) == [{"x": 3}]
    assert args(call("anthropic_style", ("y", "3"))) == [{"y": "3"}]


def test_value_newlines_and_markers_are_value_bytes() -> None:
    content = "line 1\n\n  line 2\n"
    assert args(call("write_file", ("path", "a.txt"), ("content", content))) == [
        {"path": "a.txt", "content": content}
    ]
    tricky = "</function>\n</tool_call>\n<tool_call>\n<function=x>"
    assert args(call("write_file", ("content", tricky))) == [{"content": tricky}]


def test_balanced_nested_parameter_text_is_preserved() -> None:
    nested = "<parameter=inner>\nvalue\n</parameter>\n<parameter=b>\n<parameter=c>\n</parameter>\n</parameter>"
    assert args(call("write_file", ("content", nested), ("path", "p"))) == [
        {"content": nested, "path": "p"}
    ]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<tool_call>\nhello\n</tool_call>", "malformed_structure"),
        (
            "<tool_call>\n<function=get_weather>\nstray text\n</function>\n</tool_call>",
            "malformed_structure",
        ),
        (
            call("get_weather", ("city", "a")).replace(
                "</parameter>\n</function>", "</parameter>\n</parameter>\n</function>"
            ),
            "malformed_structure",
        ),  # standalone </parameter>
        (
            call("write_file", ("content", "<parameter=x>\nunclosed")),
            "malformed_structure",
        ),  # unmatched opener
        (call("get_weather", ("city", "a"), ("city", "b")), "duplicate_parameter"),
        (call("get weather", ("city", "a")), "invalid_tool_name"),
        (call("get_time", ("tz", "UTC")), "undeclared_tool"),
        (call("get_weather", ("city", "a")) + "\nAnything else?", "trailing_content"),
        (call("get_weather", ("city", "a")) + "\n<tool", "trailing_content"),
        (call("get_weather", ("city", "a"))[:-5], "malformed_structure"),  # output ended inside
        (
            "<tool_call>\n<function=get_weather\n<parameter=city>\nx\n</parameter>",
            "malformed_structure",
        ),
        (
            call("get_weather", ("city", "a")).replace("</function>\n", "</function>\nextra\n"),
            "malformed_structure",
        ),
        ("<tool_call>", "malformed_structure"),
    ],
)
def test_fallback_returns_every_byte(text: str, reason: str) -> None:
    full = "Preface. " + text
    out = parse(full)
    assert out.stats.fallback_reason == reason
    assert out.content == full and out.calls == ()
    assert out.stats.marker_seen and out.stats.calls == 0


def test_after_fallback_everything_is_text() -> None:
    bad = call("nope", ("a", "1"))
    good = call("get_weather", ("city", "x"))
    out = parse(bad + good)
    assert out.stats.fallback_reason == "undeclared_tool" and out.content == bad + good


def test_fallback_streams_region_when_detected() -> None:
    p = ToolCallParser(TOOLS)
    assert p.feed("<tool_call>\n<function=unknown_tool>") == [
        ContentDelta("<tool_call>\n<function=unknown_tool>")
    ]
    assert p.feed("\nmore") == [ContentDelta("\nmore")]
    assert p.finish() == []


def test_no_marker() -> None:
    out = parse("plain answer with <tool_calls> and </tool_call> words")
    assert out.content == "plain answer with <tool_calls> and </tool_call> words"
    assert not out.stats.marker_seen and out.stats.fallback_reason == "none"


def test_template_round_trip(qwen_template) -> None:
    arguments = {
        "query": "multi\nline <b>",
        "filters": {"z": [1, 2], "a": None},
        "limit": 3,
        "tags": ["x"],
        "score": 0.5,
        "anything": "free text",
    }
    msgs = [
        {"role": "user", "content": "find"},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "search", "arguments": json.dumps(arguments)},
                },
                {
                    "id": "d",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Nice", "days": 1}'},
                },
            ],
        },
    ]
    text = qwen_template.render(msgs, tools=TOOLS, add_generation_prompt=False).text
    reply = text.split("</think>\n\n")[-1].removesuffix("<|im_end|>\n")
    out = parse(reply)
    assert out.content == "On it.\n\n"
    assert out.calls[0].arguments == json.dumps(arguments, ensure_ascii=False)
    assert out.calls[1].arguments == '{"city": "Nice", "days": 1}'


# --- streaming invariance ----------------------------------------------------------------------

fragments = st.sampled_from(
    [
        "hi ",
        "\n",
        "<",
        "<tool",
        "<tool_call>",
        "</tool_call>",
        "<function=get_weather>",
        "<function=write_file>",
        "<function=bad name>",
        "<parameter=city>",
        "<parameter=content>",
        "<parameter=days>",
        "</parameter>",
        "</function>",
        "Paris",
        "12",
        "好🙂",
        " ",
        call("get_weather", ("city", "Oslo"), ("days", "2")),
        call("write_file", ("content", "<parameter=x>\ny\n</parameter>")),
    ]
)


def normalized(events) -> list:
    out: list = []
    for e in events:
        if isinstance(e, ContentDelta) and out and isinstance(out[-1], ContentDelta):
            out[-1] = ContentDelta(out[-1].text + e.text)
        elif not (isinstance(e, ContentDelta) and not e.text):
            out.append(e)
    return out


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(fragments, max_size=14), cuts=st.lists(st.integers(0, 400), max_size=15))
def test_hypothesis_chunking_does_not_matter(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    p1, p2 = ToolCallParser(TOOLS, ids()), ToolCallParser(TOOLS, ids())
    whole = p1.feed(text) + p1.finish()
    split = [e for a, b in itertools.pairwise(bounds) for e in p2.feed(text[a:b])] + p2.finish()
    assert normalized(split) == normalized(whole)
    assert p1.stats == p2.stats
    content = "".join(e.text for e in whole if isinstance(e, ContentDelta))
    if not p1.calls:
        assert content == text  # no structured call: not a byte lost
    for i, c in enumerate(p1.calls):
        deltas = "".join(
            e.text for e in whole if isinstance(e, ToolCallArgumentsDelta) and e.index == i
        )
        assert deltas == c.arguments and isinstance(json.loads(c.arguments), dict)

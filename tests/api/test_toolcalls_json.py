"""Hermes JSON tool-call parsing (Qwen2.5 and Hermes templates): compact arguments, lossless
fallback, the XML parser's streaming contract, and the format chosen from the chat template."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.api.service.toolcalls import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ninfer.api.service.toolcalls_json import (
    JsonToolCallParser,
    parse_calls,
    template_tool_format,
)
from tests.api.test_toolcalls import TOOLS, ids, normalized


def jcall(name: str, arguments: object = None, *, raw: str | None = None) -> str:
    body = raw if raw is not None else json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def parse(text: str):
    return parse_calls(text, TOOLS, "json", make_id=ids())


def test_single_call_events_and_compact_arguments() -> None:
    p = JsonToolCallParser(TOOLS, make_id=ids())
    text = "Let me check.\n\n" + jcall("get_weather", {"city": "Paris", "days": 2})
    events = p.feed(text) + p.finish()
    expected = '{"city":"Paris","days":2}'
    assert events == [
        ContentDelta("Let me check.\n\n"),
        ToolCallStart(0, "call_0", "get_weather"),
        ToolCallArgumentsDelta(0, expected),
        ToolCallEnd(0, p.calls[0]),
    ]
    assert p.calls[0].arguments == expected
    assert p.stats.calls == 1 and p.stats.fallback_reason == "none" and p.stats.marker_seen


def test_member_order_unicode_and_several_calls() -> None:
    text = (
        jcall("search", {"query": "Zürich 🙂", "limit": None, "filters": {"b": 1, "a": [1.5]}})
        + "\n"
        + jcall("get_weather", {"city": "Oslo"})
    )
    out = parse(text)
    assert out.content == "" and out.stats.fallback_reason == "none"
    assert [c.name for c in out.calls] == ["search", "get_weather"]
    assert (
        out.calls[0].arguments == '{"query":"Zürich 🙂","limit":null,"filters":{"b":1,"a":[1.5]}}'
    )


def test_arguments_as_json_string_missing_arguments_and_extra_members() -> None:
    raw = '{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}'
    assert parse(jcall("", raw=raw)).calls[0].arguments == '{"city":"Rome"}'
    assert parse(jcall("", raw='{"name": "get_weather"}')).calls[0].arguments == "{}"
    raw = '{"name": "get_weather", "arguments": {}, "id": 3}'
    assert parse(jcall("", raw=raw)).calls[0].arguments == "{}"


def test_content_streams_and_only_marker_prefix_is_held() -> None:
    p = JsonToolCallParser(TOOLS)
    assert p.feed("Hello <tool") == [ContentDelta("Hello ")]
    assert p.content_held == "<tool"
    assert p.feed("box>") == [ContentDelta("<toolbox>")]
    assert p.finish() == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<tool_call>\n{bad json}\n</tool_call>", "malformed_structure"),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"c": 1}\n</tool_call>',
            "malformed_structure",
        ),
        ("<tool_call>\nget_weather\n</tool_call>", "malformed_structure"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "malformed_structure"),
        ('<tool_call>\n{"name": 3}\n</tool_call>', "malformed_structure"),
        (jcall("get_weather", [1, 2]), "malformed_structure"),
        (jcall("", raw='{"name": "get_weather", "arguments": "not json"}'), "malformed_structure"),
        (
            jcall("", raw='{"name": "get_weather", "arguments": {"a": 1, "a": 2}}'),
            "malformed_structure",
        ),
        (jcall("", raw='{"name": "get_weather", "arguments": {"a": NaN}}'), "malformed_structure"),
        (
            jcall("", raw='{"name": "get_weather", "arguments": {"a": 1e999}}'),
            "malformed_structure",
        ),
        (jcall("get_weather", {}).removesuffix("</tool_call>"), "malformed_structure"),
        (jcall("get_weather", {}) + "{}", "trailing_content"),
        ('<tool_call>\n{"name": "get_weather"} x\n</tool_call>', "malformed_structure"),
        (jcall("get_weather", {}) + "\nThanks!", "trailing_content"),
        (jcall("delete_everything", {}), "undeclared_tool"),
        (jcall("bad name!", {}), "invalid_tool_name"),
        ("Answer:\n<tool_call>", "malformed_structure"),
    ],
)
def test_fallback_returns_every_byte(text: str, reason: str) -> None:
    out = parse(text)
    assert out.content == text and out.calls == ()
    assert out.stats.fallback_reason == reason and out.stats.calls == 0


def test_closer_inside_a_string_is_argument_text() -> None:
    args = {"content": "x</tool_call>\n<tool_call>y", "path": "a"}
    out = parse(jcall("write_file", args))
    assert json.loads(out.calls[0].arguments) == args


def test_fallback_streams_region_when_detected() -> None:
    p = JsonToolCallParser(TOOLS)
    assert p.feed("<tool_call>\n") == []
    assert p.feed("get_weather") == [ContentDelta("<tool_call>\nget_weather")]
    assert p.feed(" more") == [ContentDelta(" more")]
    assert p.stats.fallback_reason == "malformed_structure"


def test_template_round_trip(qwen_tokenizer) -> None:
    """What the Hermes template renders as assistant history parses back to the same calls."""
    from ninfer.api.service.template import chat_template_for

    template = chat_template_for(HERMES_TEMPLATE, qwen_tokenizer)
    assert template.tool_call_format == "json"
    calls = [
        {"city": "Nice", "days": 1},
        {"query": 'a "quoted" </tool_call> 好', "filters": {"k": [1, 2]}},
    ]
    names = ["get_weather", "search"]
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": n, "arguments": json.dumps(a)},
                }
                for i, (n, a) in enumerate(zip(names, calls, strict=True))
            ],
        },
    ]
    text = template.render(msgs, tools=TOOLS, add_generation_prompt=False).text
    reply = text.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")
    out = parse(reply)
    assert out.content == "On it.\n"
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == list(
        zip(names, calls, strict=True)
    )


# A Hermes-format ChatML template in the form of Qwen2.5's: tools as JSON in the system turn,
# calls as {"name", "arguments"} JSON inside <tool_call>.
HERMES_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def test_format_is_chosen_from_the_template_source() -> None:
    from ninfer.api.service.template import TEMPLATES_DIR

    assert template_tool_format(HERMES_TEMPLATE, True) == "json"
    assert template_tool_format((TEMPLATES_DIR / "qwen_xml.jinja").read_text(), True) == "xml"
    # a template that does not read tools gets ninfer's own (XML) tool text
    assert template_tool_format(HERMES_TEMPLATE, False) == "xml"
    assert template_tool_format("{{ messages }}", True) == "xml"


# --- streaming invariance ----------------------------------------------------------------------

fragments = st.sampled_from(
    [
        "hi ",
        "\n",
        "<",
        "<tool",
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        '"',
        '{"name": "get_weather", ',
        '"arguments": ',
        '{"city": "Oslo", "days": 2}',
        '"</tool_call>"',
        "1e999",
        "好🙂",
        " ",
        jcall("get_weather", {"city": "Oslo", "days": 2}),
        jcall("write_file", {"content": "</tool_call>{"}),
        jcall("nope", {}),
    ]
)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(fragments, max_size=14), cuts=st.lists(st.integers(0, 400), max_size=15))
def test_hypothesis_chunking_does_not_matter(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    p1, p2 = JsonToolCallParser(TOOLS, ids()), JsonToolCallParser(TOOLS, ids())
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


@settings(max_examples=150, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["get_weather", "search"]),
            st.dictionaries(
                st.text(max_size=6),
                st.recursive(
                    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: (
                        st.lists(c, max_size=3)
                        | st.dictionaries(st.text(max_size=4), c, max_size=3)
                    ),
                    max_leaves=6,
                ),
                max_size=4,
            ),
        ),
        min_size=1,
        max_size=3,
    ),
    lead=st.text(max_size=10).filter(lambda s: "<" not in s),
)
def test_hypothesis_arguments_round_trip(calls, lead) -> None:
    """Any JSON arguments come back as the same object, compactly, in member order."""
    text = lead + "\n".join(jcall(n, a) for n, a in calls)
    out = parse(text)
    assert out.stats.fallback_reason == "none" and out.content == lead
    for (name, a), c in zip(calls, out.calls, strict=True):
        assert c.name == name and json.loads(c.arguments) == a
        assert list(json.loads(c.arguments)) == list(a)
        assert c.arguments == json.dumps(a, ensure_ascii=False, separators=(",", ":"))

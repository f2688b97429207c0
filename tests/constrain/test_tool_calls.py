"""Forced and strict tool calls: whatever the model samples under the mask, ninfer's own Qwen XML
tool-call parser reads a call to a declared tool, and its arguments validate."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from ninfer.api.service.toolcalls import parse_tool_calls
from ninfer.constrain import ForcedToolCall, StrictTools, ToolSpec, compile_constraint
from tests.constrain.helpers import Vocab, decode_random

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "pattern": "^[a-z ]{1,10}$"},
        "filters": {
            "type": "object",
            "properties": {
                "lang": {"enum": ["en", "fr"]},
                "max": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["lang"],
            "additionalProperties": False,
        },
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
    },
    "required": ["query", "filters"],
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}


def specs(*names: str) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(
            t["function"]["name"],
            t["function"]["parameters"],
            path=f"tools[{i}].function.parameters",
        )
        for i, t in enumerate(TOOLS)
        if t["function"]["name"] in names
    )


def check_calls(text: str, allowed: set[str]) -> list[str]:
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.stats.fallback_reason == "none", (parsed.stats, text)
    assert parsed.calls and parsed.content.strip() == "", text
    for call in parsed.calls:
        assert call.name in allowed
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return [c.name for c in parsed.calls]


@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_choice_always_parses_and_validates(vocab: Vocab, parallel: bool) -> None:
    constraint = compile_constraint(
        ForcedToolCall(specs("get_weather", "search"), parallel), vocab.info
    )
    names = []
    for ids, matcher in decode_random(constraint, seeds=range(20)):
        assert matcher.is_terminated(), vocab.decode(ids)
        called = check_calls(vocab.decode(ids), {"get_weather", "search"})
        assert parallel or len(called) == 1
        names += called
    assert set(names) == {"get_weather", "search"}  # the random walk reaches both tools


def test_named_tool_choice_calls_only_that_tool(tiny: Vocab) -> None:
    constraint = compile_constraint(ForcedToolCall(specs("search"), parallel=False), tiny.info)
    for ids, _ in decode_random(constraint, seeds=range(20)):
        assert check_calls(tiny.decode(ids), {"search"}) == ["search"]


def test_markers_are_the_tokenizers_added_tokens(tiny: Vocab) -> None:
    """In the tiny agent's tokenizer `<tool_call>` is one token: the constraint forces that token
    (the model's own spelling) rather than the text spelled in pieces."""
    m = compile_constraint(ForcedToolCall(specs("search")), tiny.info).matcher()
    newlines = {*tiny.encode("\n"), *tiny.encode("\n\n")}  # a blank line may come first
    assert set(m.allowed_token_ids()) - newlines == {tiny.info.added_tokens["<tool_call>"]}


def test_strict_tools_text_then_valid_call(vocab: Vocab) -> None:
    constraint = compile_constraint(StrictTools(specs("get_weather", "search")), vocab.info)
    prefix = vocab.encode("Let me look that up.\n\n<tool_call>")
    for ids, matcher in decode_random(constraint, seeds=range(20), prefix=prefix):
        assert matcher.is_terminated()
        text = vocab.decode(ids)
        parsed = parse_tool_calls(text, TOOLS)
        assert parsed.content == "Let me look that up.\n\n", text
        assert parsed.calls and parsed.stats.fallback_reason == "none"
        for call in parsed.calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_strict_tools_allow_plain_text_and_refuse_an_invalid_argument(vocab: Vocab) -> None:
    constraint = compile_constraint(StrictTools(specs("get_weather")), vocab.info)
    m = constraint.matcher()
    for t in vocab.encode("No tool needed: it is sunny."):
        assert m.advance(t), m.error
    assert m.is_accepting()

    m = constraint.matcher()
    good = (
        "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    )
    for t in vocab.encode(good):
        assert m.advance(t), m.error
    bad = vocab.encode("<parameter=days>\n99")  # maximum is 14
    assert not all(m.advance(t) for t in bad)


def test_non_strict_tool_keeps_free_values(tiny: Vocab) -> None:
    loose = ToolSpec("get_weather", WEATHER, strict=False)
    constraint = compile_constraint(StrictTools((loose,)), tiny.info)
    m = constraint.matcher()
    text = "<tool_call>\n<function=get_weather>\n<parameter=days>\nnext week\n</parameter>\n</function>\n</tool_call>"
    assert all(m.advance(t) for t in tiny.encode(text)), m.error
    assert m.is_accepting()


def test_strict_tools_text_cannot_spell_the_call_marker(tiny: Vocab) -> None:
    """The parser reads `<tool_call>` in decoded text whatever its tokens: free text may not
    spell it out in pieces (the call must start with the marker token and be valid)."""
    m = compile_constraint(StrictTools(specs("get_weather")), tiny.info).matcher()
    pieces = tiny.encode("Sure <tool") + tiny.encode("_call") + tiny.encode(">")
    assert tiny.info.added_tokens["<tool_call>"] not in pieces
    assert not all(m.advance(t) for t in pieces)


def test_the_trained_models_own_replies_pass(tiny: Vocab, tiny_agent_prompts: list[dict]) -> None:
    """Every scripted tool-call reply of the trained tiny agent, in its own tokens (thinking
    first when on): the forced constraint (when the reply is only calls) and the strict-tools
    constraint accept it token by token and end on its EOS."""
    checked = 0
    for p in tiny_agent_prompts:
        if not p["expected"]["tool_calls"]:
            continue
        tools = tuple(
            ToolSpec(
                t["function"]["name"],
                t["function"]["parameters"],
                path=f"tools[{i}].function.parameters",
            )
            for i, t in enumerate(p["tools"])
        )
        reply = tiny.encode(p["reply"])
        only_calls = not p["expected"]["content"]
        for spec in [StrictTools(tools)] + ([ForcedToolCall(tools)] if only_calls else []):
            m = compile_constraint(spec, tiny.info).matcher(thinking=p["enable_thinking"])
            for t in reply:
                assert m.advance(t), (p["name"], type(spec).__name__, m.error, tiny.decode([t]))
            assert m.is_terminated(), p["name"]
            checked += 1
    assert checked >= 20


def test_strict_tools_with_a_json_answer_are_that_answer_or_calls(tiny: Vocab) -> None:
    """An output format sent with tools: every random output is the JSON answer, valid against
    its schema, or valid calls; never free text."""
    from ninfer.constrain import JsonSchema

    answer = {
        "type": "object",
        "properties": {"summary": {"type": "string", "maxLength": 10}},
        "required": ["summary"],
        "additionalProperties": False,
    }
    spec = StrictTools(specs("get_weather"), answer=JsonSchema(answer, True, "text.format.schema"))
    kinds = set()
    for ids, matcher in decode_random(compile_constraint(spec, tiny.info), seeds=range(30)):
        assert matcher.is_terminated()
        text = tiny.decode(ids)
        parsed = parse_tool_calls(text, TOOLS)
        if parsed.calls:
            kinds.add("calls")
            assert parsed.content.strip() == "", text
            for call in parsed.calls:
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        else:
            kinds.add("answer")
            jsonschema.validate(json.loads(text), answer)
    assert kinds == {"calls", "answer"}

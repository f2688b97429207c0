"""Forced and strict tool calls in the Hermes JSON form (`call_format="json"`, for a chat
template that teaches `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`): whatever
the model samples under the mask, ninfer's JSON tool-call parser reads calls to declared tools
whose arguments validate."""

from __future__ import annotations

import json

import jsonschema

from ninfer.api.service.toolcalls_json import parse_calls
from ninfer.constrain import ForcedToolCall, StrictTools, ToolSpec, compile_constraint
from tests.constrain.helpers import Vocab, decode_random
from tests.constrain.test_tool_calls import SCHEMAS, TOOLS, WEATHER, specs


def check_calls(text: str, allowed: set[str], content: str = "") -> list[str]:
    parsed = parse_calls(text, TOOLS, "json")
    assert parsed.stats.fallback_reason == "none", (parsed.stats, text)
    assert parsed.calls and parsed.content.strip() == content.strip(), text
    for call in parsed.calls:
        assert call.name in allowed
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return [c.name for c in parsed.calls]


def test_required_tool_choice_always_parses_and_validates(vocab: Vocab) -> None:
    spec = ForcedToolCall(specs("get_weather", "search"), call_format="json")
    for ids, matcher in decode_random(compile_constraint(spec, vocab.info), seeds=range(16)):
        assert matcher.is_terminated(), vocab.decode(ids)
        text = vocab.decode(ids)
        assert '{"name": "' in text and "<function=" not in text, text
        check_calls(text, {"get_weather", "search"})


def test_named_single_call(tiny: Vocab) -> None:
    spec = ForcedToolCall(specs("search"), parallel=False, call_format="json")
    for ids, _ in decode_random(compile_constraint(spec, tiny.info), seeds=range(12)):
        assert check_calls(tiny.decode(ids), {"search"}) == ["search"]


def test_strict_tools_text_then_valid_call(vocab: Vocab) -> None:
    spec = StrictTools(specs("get_weather", "search"), call_format="json")
    constraint = compile_constraint(spec, vocab.info)
    prefix = vocab.encode("Let me look that up.\n\n<tool_call>")
    for ids, matcher in decode_random(constraint, seeds=range(12), prefix=prefix):
        assert matcher.is_terminated()
        check_calls(vocab.decode(ids), {"get_weather", "search"}, "Let me look that up.")


def test_strict_tools_allow_text_and_refuse_an_invalid_or_xml_call(tiny: Vocab) -> None:
    constraint = compile_constraint(
        StrictTools(specs("get_weather"), call_format="json"), tiny.info
    )
    m = constraint.matcher()
    assert all(m.advance(t) for t in tiny.encode("No tool needed.")) and m.is_accepting()
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    m = constraint.matcher()
    assert all(m.advance(t) for t in tiny.encode(good)), m.error
    assert m.is_accepting()
    for bad in (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 99',
        '<tool_call>\n{"name": "search"',  # not a callable tool
        "<tool_call>\n<function=get_weather>",  # the other format
    ):
        m = constraint.matcher()
        assert not all(m.advance(t) for t in tiny.encode(bad)), bad


def test_non_strict_tool_takes_any_object_and_defs_resolve(tiny: Vocab) -> None:
    loose = ToolSpec("get_weather", WEATHER, strict=False)
    m = compile_constraint(StrictTools((loose,), call_format="json"), tiny.info).matcher()
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"when": "next week"}}\n</tool_call>'
    assert all(m.advance(t) for t in tiny.encode(text)), m.error
    refs = {
        "type": "object",
        "$defs": {"unit": {"enum": ["c", "f"]}},
        "properties": {"u": {"$ref": "#/$defs/unit"}},
        "required": ["u"],
    }
    spec = ForcedToolCall((ToolSpec("get_weather", refs),), call_format="json")
    for ids, _ in decode_random(compile_constraint(spec, tiny.info), seeds=range(6)):
        parsed = parse_calls(tiny.decode(ids), TOOLS, "json")
        assert parsed.calls, tiny.decode(ids)
        assert all(json.loads(c.arguments)["u"] in ("c", "f") for c in parsed.calls)

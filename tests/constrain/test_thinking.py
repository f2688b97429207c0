"""With thinking on, the constraint starts after `</think>`: the thinking text is free (but may
not end the sequence), and the answer follows the constraint."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ninfer.api.service.toolcalls import parse_tool_calls
from ninfer.constrain import ForcedToolCall, JsonSchema, ToolSpec, compile_constraint
from tests.constrain.helpers import Vocab, decode_random

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "why": {"type": "string", "maxLength": 10}},
    "required": ["answer", "why"],
    "additionalProperties": False,
}


def test_thinking_is_free_and_the_answer_is_constrained(tiny: Vocab) -> None:
    constraint = compile_constraint(JsonSchema(SCHEMA), tiny.info)
    m = constraint.matcher(thinking=True)
    allowed = set(m.allowed_token_ids())
    assert allowed == set(range(tiny.info.vocab_size)) - set(tiny.info.eos_token_ids)
    thought = tiny.encode("Is it raining? {not json} I think not.\n")
    for t in thought:
        assert m.advance(t), m.error
    assert not m.advance(tiny.info.eos_token_ids[0])  # no ending before the answer
    assert m.advance(tiny.info.think_end_id)
    assert not m.gated
    (brace,) = tiny.encode("{")
    assert set(m.allowed_token_ids()) <= {brace, *tiny.encode('{"')}


def test_thinking_then_random_answer_validates(tiny: Vocab) -> None:
    constraint = compile_constraint(JsonSchema(SCHEMA), tiny.info)
    thought = tiny.encode("Let me think.\n") + [tiny.info.think_end_id]
    m = constraint.matcher(thinking=True)
    assert all(m.advance(t) for t in thought)
    # the constraint applies from the very token after </think>: no blank line first
    assert not m.advance(tiny.encode("\n")[0])
    for ids, m in decode_random(constraint, seeds=range(20), thinking=True, prefix=thought):
        assert m.is_terminated()
        thinking, answer = tiny.decode(ids).split("</think>")
        assert thinking == "Let me think.\n"
        jsonschema.validate(json.loads(answer), SCHEMA)


def test_forced_tool_call_after_thinking(tiny: Vocab) -> None:
    city = {"type": "string", "maxLength": 16}  # bounded: a random walk rarely closes free text
    params = {"type": "object", "properties": {"city": city}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    constraint = compile_constraint(
        ForcedToolCall((ToolSpec("get_weather", params),), parallel=False), tiny.info
    )
    prefix = tiny.encode("I should call the tool.\n") + [tiny.info.think_end_id]
    for ids, m in decode_random(constraint, seeds=range(10), thinking=True, prefix=prefix):
        assert m.is_terminated()
        answer = tiny.decode(ids).split("</think>")[1]
        parsed = parse_tool_calls(answer, tools)
        assert [c.name for c in parsed.calls] == ["get_weather"], answer


def test_rollback_across_the_end_of_thinking(tiny: Vocab) -> None:
    m = compile_constraint(JsonSchema(SCHEMA), tiny.info).matcher(thinking=True)
    for t in [*tiny.encode("ok"), tiny.info.think_end_id, *tiny.encode('{"answer": "y')]:
        assert m.advance(t), m.error
    after = m.allowed_token_ids()
    m.rollback(len(tiny.encode('{"answer": "y')))
    assert not m.gated and not m.advance(tiny.encode("x")[0])  # back at the answer's start
    m.rollback(1)  # undo </think>: free again
    assert m.gated and m.advance(tiny.encode("x")[0])
    m.rollback(1)
    for t in [tiny.info.think_end_id, *tiny.encode('{"answer": "y')]:
        assert m.advance(t), m.error
    assert m.allowed_token_ids() == after


def test_thinking_needs_a_think_token(smol: Vocab) -> None:
    constraint = compile_constraint(JsonSchema(SCHEMA), smol.info)
    with pytest.raises(ValueError, match="</think>"):
        constraint.matcher(thinking=True)

"""Responses output Items and semantic SSE events built from hand-made generation event
sequences: lifecycle order, stable indexes, deltas that concatenate to the terminal Items,
namespace restoration, incomplete status and wire framing."""

from __future__ import annotations

import itertools
import json
from typing import Any

from ninfer.api.responses.sse import OutputBuilder, SseFramer
from ninfer.api.responses.tools import parse_tools
from ninfer.api.service import generation as gen
from ninfer.api.service.toolcalls import ToolCall

TOOLS = parse_tools({"tools": [
    {"type": "function", "name": "search"},
    {"type": "namespace", "name": "mcp__web", "description": "d", "tools": [{"type": "function", "name": "search"}]},
]})  # fmt: skip


def finished(
    reason: str, content: str = "", reasoning: str = "", calls: tuple[ToolCall, ...] = ()
) -> gen.Finished:
    return gen.Finished(
        reason, content, reasoning, calls, gen.Usage(10, 5, 0, 2), gen.Timings(0, 10, 1.0, 5, 1.0)
    )  # type: ignore[arg-type]


def run(events: list[gen.GenerationEvent]) -> tuple[OutputBuilder, list[dict[str, Any]]]:
    counter = itertools.count()
    builder = OutputBuilder(TOOLS, make_id=lambda prefix: f"{prefix}{next(counter)}")
    out: list[dict[str, Any]] = []
    for ev in events:
        out += builder.finish(ev) if isinstance(ev, gen.Finished) else builder.feed(ev)
    return builder, out


CALL = ToolCall("call_1", "mcp__web__search", '{"q": "x"}')
CALL2 = ToolCall("call_2", "search", '{"q": "y"}')
STREAM: list[gen.GenerationEvent] = [
    gen.Admitted(10, 0, "root"),
    gen.ReasoningText("thin"),
    gen.ReasoningText("king"),
    gen.ContentText("Let me "),
    gen.ContentText("look."),
    gen.ToolCallStart(0, "call_1", "mcp__web__search"),
    gen.ToolCallArgs(0, '{"q": '),
    gen.ToolCallArgs(0, '"x"}'),
    gen.ToolCallDone(0, CALL),
    gen.ToolCallStart(1, "call_2", "search"),
    gen.ToolCallArgs(1, '{"q": "y"}'),
    gen.ToolCallDone(1, CALL2),
    finished("tool_calls", "Let me look.", "thinking", (CALL, CALL2)),
]


def test_items_and_event_order_for_reasoning_text_and_tools():
    builder, events = run(STREAM)
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]  # fmt: skip
    assert builder.output == [
        {"id": "rs_0", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "thinking"}], "status": "completed"},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
        {"id": "fc_2", "type": "function_call", "call_id": "call_1", "name": "search", "namespace": "mcp__web",
         "arguments": '{"q": "x"}', "status": "completed"},
        {"id": "fc_3", "type": "function_call", "call_id": "call_2", "name": "search", "arguments": '{"q": "y"}', "status": "completed"},
    ]  # fmt: skip


def test_deltas_concatenate_to_the_terminal_items_and_indexes_are_stable():
    builder, events = run(STREAM)
    text: dict[int, str] = {}
    for e in events:
        if "output_index" in e and "item_id" in e:
            assert builder.output[e["output_index"]]["id"] == e["item_id"]
        if e["type"].endswith(".delta"):
            text[e["output_index"]] = text.get(e["output_index"], "") + e["delta"]
        if e["type"] == "response.output_item.done":
            assert e["item"] == builder.output[e["output_index"]]
    out = builder.output
    assert text == {
        0: out[0]["content"][0]["text"],
        1: out[1]["content"][0]["text"],
        2: out[2]["arguments"],
        3: out[3]["arguments"],
    }
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [a["status"] for a in added] == ["in_progress"] * 4 and added[2]["arguments"] == ""


def test_length_marks_the_open_item_incomplete_and_invents_no_message():
    builder, events = run(
        [gen.ReasoningText("still thinking"), finished("length", reasoning="still thinking")]
    )
    assert [it["type"] for it in builder.output] == ["reasoning"]
    assert builder.output[0]["status"] == "incomplete"
    assert (
        events[-1]["type"] == "response.output_item.done"
        and events[-1]["item"]["status"] == "incomplete"
    )


def test_finished_text_and_calls_beyond_the_deltas_are_emitted():
    builder, events = run([gen.ContentText("Hel"), finished("tool_calls", "Hello", calls=(CALL2,))])
    assert builder.output[0]["content"][0]["text"] == "Hello"
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello"
    )
    assert (
        builder.output[1]["call_id"] == "call_2" and builder.output[1]["arguments"] == '{"q": "y"}'
    )
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        == '{"q": "y"}'
    )


def test_empty_generation_has_no_items():
    builder, events = run([gen.Admitted(3, 0, "root"), finished("stop")])
    assert builder.output == [] and events == []


def test_framer_numbers_events_and_names_them_by_type():
    framer = SseFramer()
    frames = [
        framer.frame({"type": "response.created", "response": {}}),
        framer.frame({"type": "response.output_text.delta", "delta": "é"}),
    ]
    for n, f in enumerate(frames):
        text = f.decode()
        assert text.endswith("\n\n")
        name, data = text.strip().split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert name == "event: " + body["type"] and body["sequence_number"] == n
        assert list(body)[:2] == ["type", "sequence_number"]
    assert "é" in frames[1].decode()

"""Anthropic SSE and aggregate serialisation on hand-built generation event sequences.

The stream is checked frame by frame for the block lifecycle, and accumulated with the official
`anthropic` client's own stream accumulator, which must rebuild the aggregate response."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event

from ninfer.api.anthropic.endpoints import _EventPump, _frames
from ninfer.api.anthropic.sse import (
    KEEP_ALIVE,
    MessageStreamWriter,
    aggregate_message,
    stop_reason,
    thinking_signature,
    tool_use_id,
)
from ninfer.api.service.generation import (
    Admitted,
    ContentText,
    Finished,
    GenerationEvent,
    PromptProgress,
    ReasoningText,
    Timings,
    ToolCallArgs,
    ToolCallDone,
    ToolCallStart,
    Usage,
)
from ninfer.api.service.toolcalls import ToolCall
from ninfer.api.wire import errors

CALL = ToolCall("call_abc", "get_weather", '{"city": "Paris", "days": 3}')


def finished(**kw: Any) -> Finished:
    usage = Usage(prompt_tokens=30, completion_tokens=12, cached_tokens=16, reasoning_tokens=0)
    base: dict[str, Any] = {
        "reason": "stop",
        "content": "",
        "reasoning": "",
        "tool_calls": (),
        "usage": usage,
        "timings": Timings(16, 14, 1.0, 12, 2.0),
    }
    return Finished(**(base | kw))


def thinking_tool_events() -> list[GenerationEvent]:
    return [
        Admitted(30, 16, "checkpoint"),
        PromptProgress(30, 16, 14, 1.0),
        ReasoningText("I will "),
        ReasoningText("call it."),
        ContentText("Checking."),
        ToolCallStart(0, "call_abc", "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"'),
        ToolCallArgs(0, ', "days": 3}'),
        ToolCallDone(0, CALL),
        finished(
            reason="tool_calls",
            content="Checking.",
            reasoning="I will call it.",
            tool_calls=(CALL,),
        ),
    ]


def parse_frames(frames: list[str]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for f in frames:
        assert f.endswith("\n\n")
        lines = f.strip("\n").split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: ")
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def run(events: list[GenerationEvent]) -> list[tuple[str, dict[str, Any]]]:
    w = MessageStreamWriter(message_id="msg_1", model="local")
    frames = [f for e in events for f in w.feed(e)]
    assert w.ended
    return parse_frames(frames)


def accumulate(parsed: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    snapshot = None
    bufs: dict[int, bytes] = {}
    for name, data in parsed:
        if name in ("ping", "error"):
            continue
        snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return snapshot.model_dump(mode="json", exclude_none=True)


def test_block_lifecycle_for_thinking_text_and_tool_use():
    parsed = run(thinking_tool_events())
    names = [n for n, _ in parsed]
    assert names == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = parsed[0][1]["message"]
    assert start["usage"] == {
        "input_tokens": 14,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": 16,
        "output_tokens": 0,
    }
    assert start["content"] == [] and start["stop_reason"] is None
    # the signature arrives as the last delta of the thinking block, before it closes
    sig = parsed[5][1]
    assert sig["delta"] == {
        "type": "signature_delta",
        "signature": thinking_signature("I will call it."),
    }
    assert parsed[6][1] == {"type": "content_block_stop", "index": 0}
    tool_start = parsed[10][1]
    assert tool_start["index"] == 2
    assert tool_start["content_block"] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "get_weather",
        "input": {},
    }
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in parsed
        if d.get("delta", {}).get("type") == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Paris", "days": 3}
    delta = parsed[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 12 and delta["usage"]["cache_read_input_tokens"] == 16


def test_official_accumulator_rebuilds_the_aggregate():
    events = thinking_tool_events()
    streamed = accumulate(run(events))
    aggregate = aggregate_message(events[-1], message_id="msg_1", model="local")  # type: ignore[arg-type]
    assert streamed["content"] == aggregate["content"]
    assert streamed["stop_reason"] == aggregate["stop_reason"] == "tool_use"
    for key in ("input_tokens", "output_tokens", "cache_read_input_tokens"):
        assert streamed["usage"][key] == aggregate["usage"][key]
    assert aggregate["content"][0]["type"] == "thinking" and aggregate["content"][0]["signature"]
    assert aggregate["content"][2] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "get_weather",
        "input": {"city": "Paris", "days": 3},
    }


@pytest.mark.parametrize(
    "fin, reason, sequence",
    [
        (finished(reason="stop", stop_sequence="END"), "stop_sequence", "END"),
        (finished(reason="stop"), "end_turn", None),
        (finished(reason="length", length_cause="max_tokens"), "max_tokens", None),
        (finished(reason="length", length_cause="context"), "model_context_window_exceeded", None),
        (finished(reason="tool_calls", tool_calls=(CALL,)), "tool_use", None),
    ],
)
def test_stop_reasons(fin, reason, sequence):
    assert stop_reason(fin) == (reason, sequence)
    body = aggregate_message(fin, message_id="m", model="x")
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)
    parsed = run([Admitted(30, 0, "root"), fin])
    assert parsed[-2][1]["delta"] == {"stop_reason": reason, "stop_sequence": sequence}


def test_text_only_stream_and_empty_output():
    parsed = run(
        [Admitted(5, 0, "root"), ContentText("Hel"), ContentText("lo"), finished(content="Hello")]
    )
    texts = [d["delta"]["text"] for n, d in parsed if n == "content_block_delta"]
    assert texts == ["Hel", "lo"]
    assert aggregate_message(finished(content="Hello"), message_id="m", model="x")["content"] == [
        {"type": "text", "text": "Hello"}
    ]
    empty = run([Admitted(5, 0, "root"), finished()])
    assert [n for n, _ in empty] == ["message_start", "ping", "message_delta", "message_stop"]
    assert aggregate_message(finished(), message_id="m", model="x")["content"] == []


def test_errors_end_the_stream_with_an_error_event():
    parsed = run(
        [Admitted(5, 0, "root"), ContentText("Hi"), finished(reason="error", content="Hi")]
    )
    assert [n for n, _ in parsed][-2:] == ["content_block_stop", "error"]
    assert parsed[-1][1]["error"]["type"] == "api_error"
    w = MessageStreamWriter(message_id="m", model="x")
    (frame,) = w.error(errors.request_queue_timeout(30000))
    ((_, data),) = parse_frames([frame])
    assert data["error"]["type"] == "timeout_error"
    assert data["error"]["details"]["error_code"] == "request_queue_timeout"


def test_tool_use_ids():
    assert tool_use_id("call_123") == "toolu_123"
    assert tool_use_id("toolu_9") == "toolu_9"
    assert thinking_signature("a") != thinking_signature("b")


# -- transport: keep-alive and cancellation ------------------------------------------------------


async def slow_events(
    delays: list[float], events: list[GenerationEvent], closed: list[str]
) -> AsyncIterator[GenerationEvent]:
    try:
        for d, e in zip(delays, events):
            await asyncio.sleep(d)
            yield e
    finally:
        closed.append("closed")


def test_keep_alive_comment_after_silence_without_changing_events():
    events = [Admitted(5, 0, "root"), ContentText("Hi"), finished(content="Hi")]
    closed: list[str] = []

    async def main() -> list[str]:
        pump = _EventPump(slow_events([0.0, 0.25, 0.0], events, closed))
        w = MessageStreamWriter(message_id="msg_1", model="local")
        first = await pump.next(0.1)
        return [f async for f in _frames(pump, w, first, interval=0.1)]

    frames = asyncio.run(main())
    assert KEEP_ALIVE in frames
    assert parse_frames([f for f in frames if f != KEEP_ALIVE]) == run(events)
    assert frames.index(KEEP_ALIVE) == 2  # after message_start and ping, before the text
    assert closed == ["closed"]


def test_keep_alive_before_admission_then_error_event():
    closed: list[str] = []

    async def failing() -> AsyncIterator[GenerationEvent]:
        try:
            await asyncio.sleep(0.25)
            raise errors.request_queue_timeout(250)
            yield  # pragma: no cover
        finally:
            closed.append("closed")

    async def main() -> list[str]:
        pump = _EventPump(failing())
        first = await pump.next(0.1)
        assert first is None  # not admitted in time: the response starts with keep-alives
        w = MessageStreamWriter(message_id="m", model="x")
        return [f async for f in _frames(pump, w, first, interval=0.1)]

    frames = asyncio.run(main())
    assert frames[0] == KEEP_ALIVE
    ((name, data),) = parse_frames([frames[-1]])
    assert name == "error" and data["error"]["type"] == "timeout_error"
    assert closed == ["closed"]


def test_closing_the_stream_cancels_the_generation():
    closed: list[str] = []
    events = [
        Admitted(5, 0, "root"),
        ContentText("Hi"),
        ContentText("never"),
        finished(content="Hinever"),
    ]

    async def main() -> None:
        pump = _EventPump(slow_events([0.0, 0.0, 5.0, 0.0], events, closed))
        w = MessageStreamWriter(message_id="m", model="x")
        first = await pump.next(1.0)
        body = _frames(pump, w, first, interval=1.0)
        got = [await anext(body) for _ in range(4)]  # message_start, ping, block start, delta
        assert "Hi" in got[-1]
        await body.aclose()  # what the server does when the client disconnects
        await asyncio.sleep(0)

    asyncio.run(main())
    assert closed == ["closed"]

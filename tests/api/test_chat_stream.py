"""Chat Completions SSE framing over a generation event stream: chunk shapes with
stream_options.include_usage, and a stream opened before admission (keep-alive comments while
the request waits, then its chunks or an in-stream error, and cancellation when the client
leaves). The events come from plain async generators; the engine path is the e2e suite's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ninfer.api import errors
from ninfer.api.config import ServeConfig
from ninfer.api.errors import ApiError
from ninfer.api.generation import (
    Admitted,
    ContentText,
    Finished,
    GenerationEvent,
    Timings,
    Usage,
)
from ninfer.api.openai_chat import ChatCompletion, _sse
from ninfer.api.openai_chat_models import parse_chat_request
from ninfer.api.sse import KEEPALIVE, open_events, with_keepalive
from ninfer.api.state import ServerState

MODEL = "tiny-model"


def completion(**fields: Any) -> ChatCompletion:
    chat = parse_chat_request(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, **fields},
        model_id=MODEL,
        vision=False,
    )
    return ChatCompletion(ServerState(config=ServeConfig(), model_id=MODEL), chat)


def finished(content: str) -> Finished:
    return Finished(
        "stop", content, "", (), Usage(5, 2, 0, 0), Timings(0, 5, 1.0, 2, 1.0)
    )  # fmt: skip


async def slow(
    delays: list[float], events: list[GenerationEvent | ApiError], closed: list[str]
) -> AsyncIterator[GenerationEvent]:
    try:
        for d, e in zip(delays, events):
            await asyncio.sleep(d)
            if isinstance(e, ApiError):
                raise e
            yield e
    finally:
        closed.append("closed")


async def frames(
    c: ChatCompletion,
    events: AsyncIterator[GenerationEvent],
    wait_s: float,
    interval_s: float | None = None,
) -> list[bytes]:
    """What the handler sends: wait `wait_s` for the first event, then stream with keep-alives
    every `interval_s` (default `wait_s`) of silence."""
    first = await open_events(events, wait_s=wait_s)
    body = _sse(c.stream(first, events), waiting=isinstance(first, asyncio.Task))
    return [f async for f in with_keepalive(body, interval_s=interval_s or wait_s)]


def data(frames: list[bytes]) -> list[Any]:
    out = []
    for f in frames:
        if f != KEEPALIVE:
            payload = f.decode().removeprefix("data: ").strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


EVENTS = [Admitted(5, 0, "root"), ContentText("Hi"), finished("Hi")]


def test_usage_is_null_on_every_chunk_but_the_last_when_included():
    chunks = data(asyncio.run(frames(completion(), slow([0] * 3, EVENTS, []), 1.0)))
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in c for c in chunks[:-1])  # not asked: no usage member at all
    c = completion(stream_options={"include_usage": True})
    chunks = data(asyncio.run(frames(c, slow([0] * 3, EVENTS, []), 1.0)))
    *body, last, done = chunks
    assert done == "[DONE]" and last["choices"] == [] and last["usage"]["total_tokens"] == 7
    assert [c["usage"] for c in body] == [None] * len(body)
    assert [c["choices"][0]["finish_reason"] for c in body] == [None, None, "stop"]


def test_a_request_still_waiting_streams_keep_alives_then_its_chunks():
    closed: list[str] = []
    got = asyncio.run(frames(completion(), slow([0.35, 0, 0], EVENTS, closed), 0.1))
    assert got[0] == KEEPALIVE and got.count(KEEPALIVE) >= 2  # heartbeats while waiting
    # the stream opens a keep-alive interval after the request came: its first frame is one
    got = asyncio.run(frames(completion(), slow([0.3, 0, 0], EVENTS, []), 0.1, interval_s=5.0))
    assert got[0] == KEEPALIVE and got.count(KEEPALIVE) == 1
    chunks = data(got)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hi"}
    assert chunks[2]["choices"][0]["finish_reason"] == "stop" and chunks[3] == "[DONE]"
    assert closed == ["closed"]


def test_a_failure_after_the_stream_opened_is_an_error_chunk():
    closed: list[str] = []
    timeout = errors.request_queue_timeout(300)
    got = asyncio.run(frames(completion(), slow([0.25], [timeout], closed), 0.1))
    assert got[0] == KEEPALIVE
    error, done = data(got)
    assert error == timeout.body() and done == "[DONE]"
    assert closed == ["closed"]


def test_a_failure_in_time_is_an_http_error():
    async def main() -> None:
        await open_events(slow([0.0], [errors.server_overloaded()], []), wait_s=1.0)

    with pytest.raises(ApiError) as e:
        asyncio.run(main())
    assert (e.value.status, e.value.code) == (429, "server_overloaded")


def test_leaving_while_waiting_cancels_the_generation():
    closed: list[str] = []

    async def main() -> None:
        events = slow([5.0, 0, 0], EVENTS, closed)
        first = await open_events(events, wait_s=0.05)
        body = with_keepalive(_sse(completion().stream(first, events), True), interval_s=0.05)
        assert await anext(body) == KEEPALIVE
        assert await anext(body) == KEEPALIVE
        await body.aclose()  # what the server does when the client disconnects
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert closed == ["closed"]


@pytest.mark.parametrize(
    "cause, code",
    [
        (None, "internal_error"),
        ("overloaded", "server_overloaded"),
        ("queue_timeout", "request_queue_timeout"),
        ("engine", "internal_error"),
    ],
)
def test_a_generation_failure_after_admission_keeps_its_cause(cause, code):
    """A stream whose generation fails after admission ends with an error chunk naming the
    engine's cause (as the HTTP status would before the stream): not always internal_error."""
    from ninfer.runtime.request import EngineError, EngineOverloaded, QueueTimeout

    error = {
        None: None,
        "overloaded": EngineOverloaded("busy"),
        "queue_timeout": QueueTimeout("waited"),
        "engine": EngineError("the step failed"),
    }[cause]
    failed = finished("")
    failed = Finished(
        "error", "", "", (), failed.usage, failed.timings, error=error
    )  # fmt: skip

    async def go() -> list[dict[str, Any]]:
        async def events() -> AsyncIterator[GenerationEvent]:
            yield failed

        it = events()
        first = await open_events(it, wait_s=1.0)
        return [c async for c in completion().stream(first, it)]

    chunks = asyncio.run(go())
    assert chunks[-1]["error"]["code"] == code
    assert errors.generation_failure(error, pending_timeout_ms=1).body()["error"]["code"] == code

"""Chat Completions SSE framing over a generation event stream: chunk shapes with
stream_options.include_usage, keep-alive comments while an admitted request is silent, an
in-stream error for a failure after admission and an HTTP error for a refusal before it (the
stream opens at admission). The events come from plain async generators; the engine path is
the e2e suite's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ninfer.api.chat.endpoints import ChatCompletion, _sse
from ninfer.api.chat.request import parse_chat_request
from ninfer.api.server.config import ServeConfig
from ninfer.api.server.sse import KEEPALIVE, first_event, with_keepalive
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import (
    Admitted,
    ContentText,
    Finished,
    GenerationEvent,
    Timings,
    Usage,
)
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError

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
    c: ChatCompletion, events: AsyncIterator[GenerationEvent], interval_s: float = 1.0
) -> list[bytes]:
    """What the handler sends once the request is admitted: the first event, then the stream
    with keep-alives after `interval_s` of silence."""
    first = await first_event(events)  # before any byte: refusals raise here
    return [f async for f in with_keepalive(_sse(c.stream(first, events)), interval_s=interval_s)]


def data(frames: list[bytes]) -> list[Any]:
    out = []
    for f in frames:
        if f != KEEPALIVE:
            payload = f.decode().removeprefix("data: ").strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


EVENTS = [Admitted(5, 0, "root"), ContentText("Hi"), finished("Hi")]


def test_usage_is_null_on_every_chunk_but_the_last_when_included():
    chunks = data(asyncio.run(frames(completion(), slow([0] * 3, EVENTS, []))))
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in c for c in chunks[:-1])  # not asked: no usage member at all
    c = completion(stream_options={"include_usage": True})
    chunks = data(asyncio.run(frames(c, slow([0] * 3, EVENTS, []))))
    *body, last, done = chunks
    assert done == "[DONE]" and last["choices"] == [] and last["usage"]["total_tokens"] == 7
    assert [c["usage"] for c in body] == [None] * len(body)
    assert [c["choices"][0]["finish_reason"] for c in body] == [None, None, "stop"]


def test_an_admitted_request_streams_keep_alives_while_silent_then_its_chunks():
    closed: list[str] = []
    got = asyncio.run(frames(completion(), slow([0, 0.35, 0], EVENTS, closed), interval_s=0.1))
    assert got[0] != KEEPALIVE  # the stream opens with the assistant-role chunk at admission
    assert got.count(KEEPALIVE) >= 2  # heartbeats while the admitted request prefills
    chunks = data(got)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hi"}
    assert chunks[2]["choices"][0]["finish_reason"] == "stop" and chunks[3] == "[DONE]"
    assert closed == ["closed"]


@pytest.mark.parametrize("delay_s", [0.0, 0.3])
def test_a_refusal_before_admission_is_an_http_error_however_late(delay_s):
    """A request refused after waiting (here 0.3 s; in production past the 5 s keep-alive
    interval) still gets its HTTP status: no stream was opened before admission."""

    async def main() -> None:
        await first_event(slow([delay_s], [errors.server_overloaded()], []))

    with pytest.raises(ApiError) as e:
        asyncio.run(main())
    assert (e.value.status, e.value.code) == (429, "server_overloaded")


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
        first = await first_event(it)
        return [c async for c in completion().stream(first, it)]

    chunks = asyncio.run(go())
    assert chunks[-1]["error"]["code"] == code
    assert errors.generation_failure(error, pending_timeout_ms=1).body()["error"]["code"] == code

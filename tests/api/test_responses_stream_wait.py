"""A streamed Response whose request waits for admission: the stream opens at once with
response.created / response.in_progress, keep-alive comments cover the wait, and a refusal that
arrives after the stream started ends it in response.failed (docs/serving.md, "Streams and
status codes"). The event source
stands in for a queued engine request; the real queue is exercised by the e2e overload tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from ninfer.api import errors
from ninfer.api.generation import GenerationEvent
from ninfer.api.openai_responses import Prepared, _create_sse, prepare
from ninfer.api.responses_request import parse_create_request
from ninfer.api.sse import KEEPALIVE, open_events, with_keepalive
from ninfer.api.state import ServerState
from ninfer.runtime.request import SamplingParams
from tests.api.live_app import serve_config

MODEL = "tiny-model"


async def queued_then_refused(
    delay_s: float, p: Prepared | None = None
) -> AsyncIterator[GenerationEvent]:
    """A request prepared (its sampler resolved, as the service reports it to `p`) that then
    waits in the admission queue until it is refused."""
    if p is not None:
        p.record_sampling(SamplingParams(temperature=0.5, top_p=0.9))
    await asyncio.sleep(delay_s)
    raise errors.ApiError(503, "queue timeout", code="request_queue_timeout")
    yield  # pragma: no cover - makes this an async generator


async def refused_in_preparation(delay_s: float) -> AsyncIterator[GenerationEvent]:
    """A request whose preparation (rendering, tokenising) fails late, the sampler unresolved."""
    await asyncio.sleep(delay_s)
    raise errors.ApiError(400, "the rendered prompt is empty", code="invalid_prompt", param="input")
    yield  # pragma: no cover - makes this an async generator


def test_waiting_stream_opens_with_keepalives_and_fails_in_band():
    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    req = parse_create_request(
        {"model": MODEL, "input": "Hi", "stream": True}, model_id=MODEL, vision=False
    )
    p = prepare(state, req)

    async def run() -> list[bytes]:
        events = queued_then_refused(0.3, p)
        first = await open_events(events, wait_s=0.05)
        assert isinstance(first, asyncio.Task)  # nothing yet: the stream opens anyway
        return [f async for f in with_keepalive(_create_sse(state, p, first, events), 0.05)]

    frames = asyncio.run(run())
    assert KEEPALIVE in frames
    names = [f.split(b"\n", 1)[0].decode() for f in frames if f != KEEPALIVE]
    assert names == [
        "event: response.created",
        "event: response.in_progress",
        "event: response.failed",
    ]
    assert frames.index(KEEPALIVE) > 1  # the heartbeat follows the opening events
    failed = json.loads(frames[-1].split(b"data: ", 1)[1])
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "request_queue_timeout"
    assert failed["sequence_number"] == 2
    # the failed Response echoes the sampler the request was prepared with
    assert failed["response"]["temperature"] == 0.5 and failed["response"]["top_p"] == 0.9


def test_a_late_preparation_failure_is_a_stream_error_event():
    """A stream that opened while its request was still being prepared has no Response yet:
    a preparation failure then ends it with the Responses `error` event (openai's
    ResponseErrorEvent), never a Response with made-up sampling numbers."""
    from openai.types.responses import ResponseErrorEvent

    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    req = parse_create_request(
        {"model": MODEL, "input": "Hi", "stream": True}, model_id=MODEL, vision=False
    )
    p = prepare(state, req)

    async def run() -> list[bytes]:
        events = refused_in_preparation(0.2)
        first = await open_events(events, wait_s=0.05)
        assert isinstance(first, asyncio.Task)
        return [f async for f in with_keepalive(_create_sse(state, p, first, events), 0.05)]

    frames = [f for f in asyncio.run(run()) if f != KEEPALIVE]
    assert len(frames) == 1 and frames[0].startswith(b"event: error\n")
    event = ResponseErrorEvent.model_validate(json.loads(frames[0].split(b"data: ", 1)[1]))
    assert (event.code, event.param, event.sequence_number) == ("invalid_prompt", "input", 0)


def test_in_time_refusal_is_raised_before_the_stream():
    async def run() -> None:
        await open_events(queued_then_refused(0.0), wait_s=1.0)

    try:
        asyncio.run(run())
    except errors.ApiError as e:
        assert e.code == "request_queue_timeout"
    else:
        raise AssertionError("an in-time refusal must be an HTTP error")


def test_a_response_deleted_while_streaming_is_never_stored():
    """DELETE answers for a running store:true Response and keeps its result out of the store;
    GET says it is still in progress until then (GET returns terminal objects)."""
    from ninfer.api.errors import ApiError
    from ninfer.api.generation import ContentText, Finished, Timings, Usage
    from ninfer.api.openai_responses import response_store

    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    store = response_store(state)

    def finished() -> Finished:
        usage = Usage(prompt_tokens=5, completion_tokens=1, cached_tokens=0, reasoning_tokens=0)
        return Finished("stop", "Hello", "", (), usage, Timings(0, 5, 1.0, 1, 1.0))

    async def source(p: Prepared) -> AsyncIterator[GenerationEvent]:
        p.record_sampling(SamplingParams())  # prepared, as the service reports it
        yield ContentText("Hello")
        yield finished()

    async def stream(delete_midway: bool) -> str:
        req = parse_create_request(
            {"model": MODEL, "input": "Hi", "stream": True}, model_id=MODEL, vision=False
        )
        p = prepare(state, req)
        store.begin(p.response_id)  # as the create handler does for store:true
        events = source(p)
        frames = _create_sse(state, p, await open_events(events), events)
        async for frame in frames:
            if frame.startswith(b"event: response.in_progress"):
                try:
                    store.require(p.response_id)
                except ApiError as e:
                    assert "still in progress" in e.message
                else:
                    raise AssertionError("a running response was retrievable")
                if delete_midway:
                    assert store.delete(p.response_id)
        return p.response_id

    kept = asyncio.run(stream(delete_midway=False))
    assert store.require(kept).response["status"] == "completed"
    gone = asyncio.run(stream(delete_midway=True))
    assert gone not in store

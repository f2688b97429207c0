"""A streamed Response opens at admission (docs/serving.md, "Streams and status codes"): a refusal before it is an
HTTP error however late it comes, a failure after it ends the stream in response.failed, and
keep-alive comments cover an admitted request's silence. The event source stands in for a
queued engine request; the real queue is exercised by the adversarial and e2e tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from ninfer.api.responses.endpoints import _create_sse, prepare
from ninfer.api.responses.request import parse_create_request
from ninfer.api.server.sse import KEEPALIVE, first_event, with_keepalive
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import Admitted, GenerationEvent
from ninfer.api.wire import errors
from ninfer.runtime.request import SamplingParams
from tests.api.live_app import serve_config

MODEL = "tiny-model"


async def queued_then_refused(delay_s: float) -> AsyncIterator[GenerationEvent]:
    await asyncio.sleep(delay_s)
    raise errors.ApiError(503, "queue timeout", code="request_queue_timeout")
    yield  # pragma: no cover - makes this an async generator


def test_a_failure_after_admission_ends_in_response_failed():
    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    req = parse_create_request(
        {"model": MODEL, "input": "Hi", "stream": True}, model_id=MODEL, vision=False
    )
    p = prepare(state, req)

    async def admitted_then_refused() -> AsyncIterator[GenerationEvent]:
        p.record_sampling(SamplingParams(temperature=0.5, top_p=0.9))  # as the service does
        yield Admitted(5, 0, "root")
        async for e in queued_then_refused(0.3):
            yield e  # pragma: no cover - it raises

    async def run() -> list[bytes]:
        events = admitted_then_refused()
        first = await first_event(events)
        return [f async for f in with_keepalive(_create_sse(state, p, first, events), 0.05)]

    frames = asyncio.run(run())
    assert KEEPALIVE in frames  # the admitted request was silent: heartbeats
    names = [f.split(b"\n", 1)[0].decode() for f in frames if f != KEEPALIVE]
    assert names == [
        "event: response.created",
        "event: response.in_progress",
        "event: response.failed",
    ]
    failed = json.loads(frames[-1].split(b"data: ", 1)[1])
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "request_queue_timeout"
    # the failed Response echoes the sampler the request was prepared with
    assert failed["response"]["temperature"] == 0.5 and failed["response"]["top_p"] == 0.9


def test_a_refusal_before_admission_is_an_http_error_however_late():
    async def run() -> None:
        await first_event(queued_then_refused(0.3))

    try:
        asyncio.run(run())
    except errors.ApiError as e:
        assert e.code == "request_queue_timeout"
    else:
        raise AssertionError("a refusal before admission must be an HTTP error")


def test_a_response_deleted_while_streaming_is_never_stored():
    """DELETE answers for a running store:true Response and keeps its result out of the store;
    GET says it is still in progress until then (docs/serving.md: GET returns terminal objects)."""
    from ninfer.api.responses.endpoints import response_store
    from ninfer.api.service.generation import ContentText, Finished, Timings, Usage
    from ninfer.api.wire.errors import ApiError

    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    store = response_store(state)

    def finished() -> Finished:
        usage = Usage(prompt_tokens=5, completion_tokens=1, cached_tokens=0, reasoning_tokens=0)
        return Finished("stop", "Hello", "", (), usage, Timings(0, 5, 1.0, 1, 1.0))

    async def source(p) -> AsyncIterator[GenerationEvent]:
        p.record_sampling(SamplingParams())  # as the service does before admission
        yield ContentText("Hello")
        yield finished()

    async def stream(delete_midway: bool) -> str:
        req = parse_create_request(
            {"model": MODEL, "input": "Hi", "stream": True}, model_id=MODEL, vision=False
        )
        p = prepare(state, req)
        store.begin(p.response_id)  # as the create handler does for store:true
        events = source(p)
        frames = _create_sse(state, p, await first_event(events), events)
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

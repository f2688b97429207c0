"""Anthropic endpoints: POST /v1/messages (aggregate and SSE) and /v1/messages/count_tokens.

The handlers parse the body (`request.parse_messages_request`), hand the resulting
`GenerationRequest` to the model service (`state.service`), and serialise its events
(`anthropic_sse`). Every response carries a `request-id` header; every error uses the
Anthropic body and categories (`anthropic_errors`).

Streaming: the handler waits up to 5 s for the first event before answering, so preparation
and admission failures that come quickly (invalid prompt, context overflow, 529 overload) are
ordinary HTTP errors. If admission takes longer, the SSE response starts with `: keep-alive`
comments and a later failure (e.g. 504 queue timeout) is an `error` event. While the stream
runs, a keep-alive comment follows every 5 s without a protocol event. A client disconnect
(aggregate or streamed) cancels the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.handlers import BaseRouteHandler
from litestar.response import Stream

from ninfer.api.anthropic.request import MessagesRequest, parse_messages_request
from ninfer.api.anthropic.sse import (
    KEEP_ALIVE,
    KEEP_ALIVE_S,
    MessageStreamWriter,
    aggregate_message,
    new_message_id,
)
from ninfer.api.server.disconnect import unless_disconnected
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import Finished, GenerationEvent, GenerationRequest
from ninfer.api.service.template_options import ThinkingDefaults
from ninfer.api.wire import errors
from ninfer.api.wire.anthropic_errors import (
    REQUEST_ID_HEADER,
    anthropic_error_body,
    generation_failure,
)
from ninfer.api.wire.errors import CLIENT_CLOSED_STATUS, ApiError
from ninfer.api.wire.offload import decode_body

log = logging.getLogger("ninfer.api")


def screened_message(state: ServerState, body: dict[str, Any]) -> GenerationRequest:
    """The GenerationRequest /v1/messages prepares for `body` (for the body-screening worker,
    ninfer.api.service.body_screen)."""
    return _parse(state, body, count_only=False).generation_request()


def screened_count(state: ServerState, body: dict[str, Any]) -> GenerationRequest:
    """The GenerationRequest /v1/messages/count_tokens counts for `body` (for the
    body-screening worker)."""
    return _parse(state, body, count_only=True).generation_request()


def _parse(state: ServerState, body: dict[str, Any], count_only: bool) -> MessagesRequest:
    cfg = state.config
    return parse_messages_request(
        body,
        vision=cfg.vision,
        default_max_tokens=cfg.engine.default_max_tokens,
        thinking_defaults=ThinkingDefaults.from_flags(cfg.thinking, cfg.preserve_thinking),
        count_only=count_only,
    )


def route_handlers(state: ServerState) -> list[BaseRouteHandler]:
    """The Anthropic handlers bound to `state` (registered by app.PROTOCOL_MODULES)."""

    async def parse(request: Request[Any, Any, Any], *, count_only: bool) -> MessagesRequest:
        return await decode_body(
            request,
            lambda body: _parse(state, body, count_only),
            screen=state.screen(screened_count if count_only else screened_message),
        )

    @post("/v1/messages", status_code=200, exception_handlers={Exception: handle_exception})
    async def create_message(request: Request[Any, Any, Any]) -> Response[Any]:
        rid = request_id(request)
        req = await parse(request, count_only=False)
        service = _service(state)
        events = service.generate(req.generation_request(), request_id=rid)
        pending_ms = state.config.engine.pending_timeout_ms
        if req.stream:
            return await _stream_response(events, req, rid, pending_ms, request)
        finished = await unless_disconnected(_drain(events), request, events)
        if finished is None:  # the client went away; nobody reads this
            return Response({}, status_code=CLIENT_CLOSED_STATUS, headers={REQUEST_ID_HEADER: rid})
        if finished.reason == "error":
            log.error("generation %s failed: %r", rid, finished.error)
            raise generation_failure(finished.error, pending_timeout_ms=pending_ms)
        body = aggregate_message(finished, message_id=new_message_id(), model=req.model)
        return Response(body, status_code=200, headers={REQUEST_ID_HEADER: rid})

    @post(
        "/v1/messages/count_tokens",
        status_code=200,
        exception_handlers={Exception: handle_exception},
    )
    async def count_tokens(request: Request[Any, Any, Any]) -> Response[Any]:
        rid = request_id(request)
        req = await parse(request, count_only=True)
        service = _service(state)
        n = await service.count_prompt_tokens(req.generation_request())
        return Response({"input_tokens": n}, status_code=200, headers={REQUEST_ID_HEADER: rid})

    return [create_message, count_tokens]


# -----------------------------------------------------------------------------------------------
# Errors and ids
# -----------------------------------------------------------------------------------------------


def request_id(request: Request[Any, Any, Any]) -> str:
    """The id the app's RequestId layer gave this HTTP request."""
    rid = request.scope.get("state", {}).get("request_id")
    return rid if isinstance(rid, str) else ""


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Any exception of an Anthropic handler as an Anthropic error response."""
    if isinstance(exc, ApiError):
        err = exc
    else:
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        err = errors.internal_error()
    rid = request_id(request)
    status, body = anthropic_error_body(err, rid)
    return Response(body, status_code=status, headers={REQUEST_ID_HEADER: rid})


def _service(state: ServerState) -> Any:
    service = getattr(state, "service", None) or state.extra.get("service")
    if service is None:
        raise errors.engine_unavailable()
    return service


# -----------------------------------------------------------------------------------------------
# Aggregate
# -----------------------------------------------------------------------------------------------


async def _drain(events: AsyncIterator[GenerationEvent]) -> Finished:
    """The Finished event of `events`; ApiErrors raised by the service propagate."""
    async for event in events:
        if isinstance(event, Finished):
            return event
    raise RuntimeError("generation ended without a Finished event")


# -----------------------------------------------------------------------------------------------
# Streaming
# -----------------------------------------------------------------------------------------------


class _EventPump:
    """Pulls events from the service iterator one task at a time, so that a wait for the next
    event can time out (for keep-alives) without cancelling the generation."""

    def __init__(self, events: AsyncIterator[GenerationEvent]) -> None:
        self.events = events
        self.pending: asyncio.Future[GenerationEvent] | None = None

    async def next(self, timeout: float | None) -> GenerationEvent | None:
        """The next event, or None when `timeout` seconds (None: no limit) pass first. Raises StopAsyncIteration
        at the end and whatever the service raises."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(anext(self.events))  # type: ignore[arg-type]
        done, _ = await asyncio.wait({self.pending}, timeout=timeout)
        if not done:
            return None
        fut, self.pending = self.pending, None
        return fut.result()

    async def close(self) -> None:
        """Stop the generation (idempotent)."""
        if self.pending is not None and not self.pending.done():
            self.pending.cancel()  # the service generator's cleanup cancels the engine request
            self.pending = None
            return
        self.pending = None
        aclose = getattr(self.events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _stream_response(
    events: AsyncIterator[GenerationEvent],
    req: MessagesRequest,
    rid: str,
    pending_ms: int,
    request: Request[Any, Any, Any],
) -> Response[Any]:
    pump = _EventPump(events)
    writer = MessageStreamWriter(
        message_id=new_message_id(), model=req.model, pending_timeout_ms=pending_ms
    )
    try:
        # headers go out only at admission: refusals before it (400, 529, 504) are real
        # statuses however long they took (docs/serving.md, "Streams and status codes")
        first = await unless_disconnected(pump.next(None), request, pump.events)
    except BaseException:
        await pump.close()
        raise
    if first is None:  # the client went away before admission; nobody reads this
        await pump.close()
        return Response({}, status_code=CLIENT_CLOSED_STATUS, headers={REQUEST_ID_HEADER: rid})
    headers = {REQUEST_ID_HEADER: rid, "cache-control": "no-cache", "x-accel-buffering": "no"}
    return Stream(
        _frames(pump, writer, first),
        media_type="text/event-stream",
        headers=headers,
        background=BackgroundTask(pump.close),  # also when the body never started
    )


async def _frames(
    pump: _EventPump,
    writer: MessageStreamWriter,
    first: GenerationEvent | None,
    interval: float = KEEP_ALIVE_S,
) -> AsyncIterator[str]:
    """The SSE body: protocol frames, with a keep-alive comment after `interval` seconds without
    one. `first` is the event already pulled (None: none yet). Closing it stops the generation."""
    try:
        if first is None:
            yield KEEP_ALIVE
        else:
            for frame in writer.feed(first):
                yield frame
        while not writer.ended:
            try:
                event = await pump.next(interval)
            except StopAsyncIteration:
                break
            except ApiError as err:
                for frame in writer.error(err):
                    yield frame
                break
            except Exception as exc:
                log.error("stream failed", exc_info=exc)
                for frame in writer.error(errors.internal_error()):
                    yield frame
                break
            if event is None:
                yield KEEP_ALIVE
                continue
            for frame in writer.feed(event):
                yield frame
    finally:
        await pump.close()

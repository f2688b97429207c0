"""Server-sent-event transport helpers shared by every streaming endpoint."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from litestar import Request

from ninfer.api.server.disconnect import unless_disconnected
from ninfer.api.wire import errors

if TYPE_CHECKING:
    from ninfer.api.service.generation import GenerationEvent

KEEPALIVE = b": keep-alive\n\n"
KEEPALIVE_AFTER_S = 5.0


async def with_keepalive(
    source: AsyncIterator[bytes], interval_s: float = KEEPALIVE_AFTER_S
) -> AsyncIterator[bytes]:
    """Forward `source`, inserting the `: keep-alive` comment after `interval_s` without an
    event. The comment is transport-only: it never changes the events themselves. Closing this
    iterator (client gone) closes `source`, which cancels the generation behind it."""
    it = source.__aiter__()
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield KEEPALIVE
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except RuntimeError:  # already running/closed generator
                pass


async def first_event(events: AsyncIterator[GenerationEvent]) -> GenerationEvent:
    """The first event of a generation; preparation errors and admission refusals raise here."""
    try:
        return await events.__anext__()
    except StopAsyncIteration:  # the service always ends with Finished
        raise errors.internal_error() from None


async def open_events(
    events: AsyncIterator[GenerationEvent], request: Request[Any, Any, Any]
) -> GenerationEvent | None:
    """The first event of a stream, awaited before any byte of the response is sent: the
    status line goes out only once the request is admitted (or has failed), so every refusal
    before admission - 400 context_length_exceeded, 429 server_overloaded, 503/504
    request_queue_timeout - is a real HTTP status, however long preparation and the queue took
    (bounded by --pending-timeout-ms). See docs/serving.md, "Streams and status codes".

    Meanwhile the client is watched: None when it disconnects first (then the generation is
    closed, which cancels the engine request and frees its capacity slot). A dead peer is
    noticed there too: TCP keepalive and TCP_USER_TIMEOUT on accepted sockets make the kernel
    drop it, which the server reports as a disconnect."""
    return await unless_disconnected(first_event(events), request, events)


def generation_closer(
    events: AsyncIterator[GenerationEvent],
    after: Callable[[], object] | None = None,
) -> Callable[[], Awaitable[None]]:
    """The cleanup a streamed response runs when it ends, however it ends (the Stream's
    background task): the generation closed, which cancels its engine request. The body's own
    `finally` does the same, but only once the body has started. `after` runs last (the
    protocol's own cleanup)."""

    async def close() -> None:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):  # already closed or closing
                await aclose()
        if after is not None:
            after()

    return close

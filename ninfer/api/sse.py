"""Server-sent-event transport helpers shared by every streaming endpoint."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from ninfer.api import errors

if TYPE_CHECKING:
    from ninfer.api.generation import GenerationEvent

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
    events: AsyncIterator[GenerationEvent], wait_s: float | None = None
) -> GenerationEvent | asyncio.Task[GenerationEvent]:
    """The first event of a stream, or, when none came within `wait_s` (a request waiting for
    admission), the task still awaiting it: the stream then opens and keep-alive comments
    heartbeat the waiting client, so that a vanished one is noticed (docs/serving.md, "Streams
    and status codes"). Errors that arrive in time raise here, before any byte, as real HTTP
    statuses (429/503/400)."""
    task = asyncio.ensure_future(first_event(events))
    done, _ = await asyncio.wait({task}, timeout=KEEPALIVE_AFTER_S if wait_s is None else wait_s)
    return task.result() if done else task


def generation_closer(
    events: AsyncIterator[GenerationEvent],
    first: GenerationEvent | asyncio.Task[GenerationEvent] | None = None,
    after: Callable[[], object] | None = None,
) -> Callable[[], Awaitable[None]]:
    """The cleanup a streamed response runs when it ends, however it ends (the Stream's
    background task): the task still awaiting the first event cancelled, the generation closed,
    which cancels its engine request. The body's own `finally` does the same, but only once the
    body has started: a client gone before its first frame had its request wait in the queue
    until admission, holding a capacity slot. `after` runs last (the protocol's own cleanup)."""

    async def close() -> None:
        if isinstance(first, asyncio.Task) and not first.done():
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):  # already closed or closing
                await aclose()
        if after is not None:
            after()

    return close

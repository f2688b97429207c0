"""Cancelling a non-streamed generation whose client has gone away.

A streamed response notices a vanished client when writing (or keep-alive) fails and closes the
generation. An aggregate response writes nothing until the generation is finished, so the
handlers of every protocol await it through `unless_disconnected`: it races the work against
the ASGI `http.disconnect` message and, when the client leaves first, cancels the work and
closes the generation's event iterator, which cancels the request in the engine (as vLLM and
llama.cpp do). The request body must already have been read: later `receive()` calls only
report the disconnect (ninfer.api.server.app.BodyLimit keeps that true).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from litestar import Request

T = TypeVar("T")


async def unless_disconnected(
    work: Coroutine[Any, Any, T],
    request: Request[Any, Any, Any],
    events: AsyncIterator[Any],
) -> T | None:
    """The result of `work` (which consumes `events`), or None when the client disconnects
    first: then `work` is cancelled and `events` closed, stopping the generation. Exceptions of
    `work` propagate; cancelling the caller cancels `work` too."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()  # the cancellation reaches the service generator, whose cleanup cancels
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
    return None


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns once the client has disconnected (the body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

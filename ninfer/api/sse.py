"""Server-sent-event transport helpers shared by every streaming endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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

"""Request bodies decoded off the event loop.

Decoding and validating a large JSON body is CPU work of up to seconds (json.loads runs at
~40 MiB/s on non-ASCII text); on the event loop it would stall every other connection,
/health included. `decode_body` does it in a worker thread once the body passes
`INLINE_BYTES` (below that, a thread hop costs more than the work), with automatic garbage
collection paused (`gc_paused`) and the JSON decoded in short GIL holds
(ninfer.api.wire.json_chunked).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from litestar import Request

from ninfer.api.wire.fields import parse_json_object

T = TypeVar("T")
INLINE_BYTES = 64 * 1024


async def decode_body(
    request: Request[Any, Any, Any],
    validate: Callable[[dict[str, Any]], T],
    screen: Callable[[bytes], Awaitable[bytes | None]] | None = None,
) -> T:
    """`validate(parse_json_object(body))`: in a worker thread when the body is large. Raises
    what they raise (ApiError for the client's mistakes). `screen` (the model service's
    body-screening worker, ninfer.api.service.body_screen) may give a slim body to parse in
    place of the body: one the worker proved too long for the context, whose refusal
    preparation raises."""
    raw = await request.body()
    if screen is not None:
        raw = await screen(raw) or raw
    if len(raw) <= INLINE_BYTES:
        return validate(parse_json_object(raw))

    def work() -> T:
        with gc_paused():
            return validate(parse_json_object(raw))

    return await asyncio.to_thread(work)


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection while the block runs (in any thread; nested and
    concurrent uses count). Why: decoding a large body creates ~10^6 objects, which triggers
    full collections that each hold the GIL for hundreds of milliseconds (measured 785 ms while
    validating 100k messages), stalling the event loop; the objects made here form no cycles."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()

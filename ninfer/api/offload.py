"""Request bodies decoded off the event loop.

Decoding and validating a large JSON body is CPU work of up to seconds (json.loads runs at
~40 MiB/s on non-ASCII text); on the event loop it would stall every other connection,
/health included. `decode_body` does it in a worker thread once the body passes
`INLINE_BYTES` (below that, a thread hop costs more than the work).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from litestar import Request

from ninfer.api.fields import parse_json_object

T = TypeVar("T")
INLINE_BYTES = 64 * 1024


async def decode_body(
    request: Request[Any, Any, Any], validate: Callable[[dict[str, Any]], T]
) -> T:
    """`validate(parse_json_object(body))`: in a worker thread when the body is large. Raises
    what they raise (ApiError for the client's mistakes)."""
    raw = await request.body()
    if len(raw) <= INLINE_BYTES:
        return validate(parse_json_object(raw))
    return await asyncio.to_thread(lambda: validate(parse_json_object(raw)))

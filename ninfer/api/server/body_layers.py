"""ASGI layers that judge a request body before any handler sees it: its content type
(`JsonOnly`, 415) and its size, count and arrival time (`BodyLimit`, 413/429/408). Installed by
ninfer.api.server.app.create_app; see its module docstring for the order of all layers."""

from __future__ import annotations

import asyncio

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from ninfer.api.server.error_response import send_error
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError


class BodyLimit:
    """Reads each request body whole, within a count, a size and a time limit, before the app
    sees it (it would be read whole for JSON parsing anyway), and replays it as one message;
    later `receive()` calls go to the server, so handlers still observe `http.disconnect`.

    - size: a body over `limit` bytes is 413 request_too_large (Content-Length checked first,
      chunked bodies counted);
    - count: at most `slots` requests with a body are read or served at once: the
      outstanding-request capacity (max_concurrency + max_pending_requests) plus one, so that a
      generation request beyond the capacity still reaches the model service, whose 429 is
      logged and counted; one more is 429 server_overloaded before a byte of its body is read,
      so buffered bodies never hold more than slots x --max-request-mib (an unfinished upload
      keeps its slot);
    - time: a body not complete `timeout_s` after its headers is 408 request_timeout
      (--client-timeout-s), which frees the slot a stalled upload would hold.
    """

    def __init__(
        self, app: ASGIApp, limit: int, limit_mib: int, slots: int, timeout_s: float
    ) -> None:
        self.app = app
        self.limit = limit
        self.limit_mib = limit_mib
        self.slots = slots
        self.timeout_s = timeout_s
        self.in_flight = 0  # requests holding a body slot (read on the event loop only)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, has_body = _declared_body(scope)
        if declared > self.limit:
            await send_error(send, errors.request_too_large(self.limit_mib), scope)
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.slots:
            await send_error(send, errors.server_overloaded(), scope)
            return
        self.in_flight += 1
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    body = await self._read(receive)
            except TimeoutError:
                await send_error(send, errors.request_timeout(self.timeout_s), scope)
                return
            if body is None:  # the client went away, or the body was too large (answered)
                return
            if isinstance(body, ApiError):
                await send_error(send, body, scope)
                return
            replayed = False

            async def replay() -> Message:
                nonlocal replayed, body
                if not replayed:
                    replayed = True
                    message = {"type": "http.request", "body": body, "more_body": False}
                    body = b""  # the handler holds it now; do not keep a second reference
                    return message  # type: ignore[return-value]
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.in_flight -= 1

    async def _read(self, receive: Receive) -> bytes | ApiError | None:
        """The whole body, an ApiError 413 when it passes the limit, None on a disconnect."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnect before the body was complete
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return errors.request_too_large(self.limit_mib)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _declared_body(scope: Scope) -> tuple[int, bool]:
    """(Content-Length or 0, whether the request carries a body at all)."""
    declared, chunked = 0, False
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = 0
        elif name == b"transfer-encoding":
            chunked = True
    return declared, declared > 0 or chunked


JSON_MEDIA_TYPE = "application/json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class JsonOnly:
    """Every request body must be `Content-Type: application/json` (charset utf-8, if given)
    with no content coding: anything else is 415 unsupported_media_type before the body is read.

    Why: a page in a browser may send text/plain, form or untyped bodies to any origin without a
    CORS preflight; an API that took them could be driven cross-site when it has no --api-key.
    application/json needs a preflight, which only --cors answers. A Content-Encoding (gzip...)
    is refused rather than read as JSON: the server decodes none.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        if not _declared_body(scope)[1]:
            await self.app(scope, receive, send)
            return
        refusal = json_body_refusal(scope)
        if refusal is not None:
            await send_error(send, refusal, scope)
            return
        await self.app(scope, receive, send)


def json_body_refusal(scope: Scope) -> ApiError | None:
    """The 415 for a body that is not plain application/json, else None."""
    content_type: bytes | None = None
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name == b"content-type":
            content_type = value
        elif name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            return errors.unsupported_media_type(
                f"Content-Encoding {errors.clip(value.decode('latin-1'), 40)} is not supported; "
                "send the JSON body uncompressed"
            )
    if content_type is None:
        return errors.unsupported_media_type(
            "the request has a body but no Content-Type; send it as application/json"
        )
    media, _, params = content_type.decode("latin-1").partition(";")
    if media.strip().lower() != JSON_MEDIA_TYPE:
        return errors.unsupported_media_type(
            f"Content-Type {errors.clip(media.strip(), 60)} is not supported; "
            "send the body as application/json"
        )
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return errors.unsupported_media_type(
                f"charset {errors.clip(value.strip(), 30)} is not supported; JSON is UTF-8"
            )
    return None

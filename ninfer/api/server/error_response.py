"""Error responses sent straight over ASGI, by the layers outside Litestar's routing."""

from __future__ import annotations

import json

from litestar.types import Scope, Send

from ninfer.api.wire.anthropic_errors import anthropic_error_body, is_anthropic_request
from ninfer.api.wire.errors import ApiError


def error_headers(err: ApiError) -> dict[str, str]:
    """Headers an error carries besides the body: WWW-Authenticate on a 401 (RFC 9110)."""
    return {"www-authenticate": "Bearer"} if err.status == 401 else {}


async def send_error(send: Send, err: ApiError, scope: Scope | None = None) -> None:
    """Answer with `err` directly over ASGI (for layers outside Litestar's routing); in the
    Anthropic shape on the Anthropic endpoints."""
    status, payload = err.status, err.body()
    if scope is not None and is_anthropic_request(scope):
        status, payload = anthropic_error_body(err, scope.get("state", {}).get("request_id"))
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in error_headers(err).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})

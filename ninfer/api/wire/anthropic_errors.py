"""Anthropic error responses: categories, HTTP statuses and the wire body.

Every error on an Anthropic endpoint (/v1/messages...) — a handler's `ApiError`, an app-level
401 or 413, an unknown route — is answered in the Anthropic shape::

    {"type": "error",
     "error": {"type": "invalid_request_error", "message": "...",
               "details": {"error_code": "vision_disabled", "param": "messages[0].content[1]"}},
     "request_id": "req_..."}

`details.error_code` is where the official client reads a stable machine code
(`APIStatusError.error_code`); it carries ninfer's `ApiError.code`. The status and category
follow docs/serving.md ("Anthropic Messages"): admission overload is HTTP 529 overloaded_error,
queue and media timeouts HTTP 504 timeout_error, internal failures 500 api_error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError

ANTHROPIC_PREFIX = "/v1/messages"
REQUEST_ID_HEADER = "request-id"

_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
}


def is_anthropic_path(path: str) -> bool:
    """True for /v1/messages and the paths below it (the Anthropic endpoints)."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def is_anthropic_request(scope: Mapping[str, Any]) -> bool:
    """An Anthropic endpoint, or the Models API (shared by both protocols) asked by an
    Anthropic client (its SDK sends anthropic-version on every request): answered with
    Anthropic's error shape and request-id header."""
    path = scope["path"]
    if is_anthropic_path(path):
        return True
    if path != "/v1/models" and not path.startswith("/v1/models/"):
        return False
    return any(k.lower() == b"anthropic-version" for k, _ in scope.get("headers", ()))


def anthropic_status(err: ApiError) -> tuple[int, str]:
    """(HTTP status, Anthropic error type) of `err`.

    429 (the only 429 is admission overload) -> 529 overloaded_error; a code naming a timeout
    (request_queue_timeout, media fetch timeouts) -> 504 timeout_error; other 4xx keep their
    status with the matching category (invalid_request_error by default); 5xx -> api_error.
    """
    if err.status == 429:
        return 529, "overloaded_error"
    if err.code is not None and "timeout" in err.code and err.status >= 500:
        return 504, "timeout_error"
    if err.status < 500:
        return err.status, _BY_STATUS.get(err.status, "invalid_request_error")
    return err.status, "api_error"


def as_sent(err: ApiError) -> ApiError:
    """`err` with the HTTP status and Anthropic error type an Anthropic client receives (what
    the request log and metrics of an Anthropic request record)."""
    status, kind = anthropic_status(err)
    if (status, kind) == (err.status, err.type):
        return err
    return ApiError(status, err.message, type=kind, code=err.code, param=err.param)


def generation_failure(cause: BaseException | None, *, pending_timeout_ms: int) -> ApiError:
    """The API error of a generation that ended with reason "error" after it started, from the
    engine's cause: typed refusals map as they do before admission (overload -> 429, hence 529;
    queue timeout -> 503 request_queue_timeout, hence 504; invalid request -> 400), anything
    else is 500 engine_error. Aggregate and streamed responses both use it."""
    if isinstance(cause, ApiError):
        return cause
    if cause is not None:
        mapped = errors.from_engine_error(cause, pending_timeout_ms=pending_timeout_ms)
        if mapped is not None:
            return mapped
    return ApiError(500, "generation failed", type=errors.SERVER_ERROR, code="engine_error")


def anthropic_error_body(err: ApiError, request_id: str | None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, Anthropic error body) for `err`."""
    status, kind = anthropic_status(err)
    error: dict[str, Any] = {"type": kind, "message": err.message}
    if err.code is not None:
        details: dict[str, Any] = {"error_code": err.code}
        if err.param is not None:
            details["param"] = err.param
        error["details"] = details
    return status, {"type": "error", "error": error, "request_id": request_id}


def anthropic_stream_error(err: ApiError) -> dict[str, Any]:
    """The `error` SSE event payload for a failure after the stream has started."""
    _, kind = anthropic_status(err)
    error: dict[str, Any] = {"type": kind, "message": err.message}
    if err.code is not None:
        error["details"] = {"error_code": err.code}
    return {"type": "error", "error": error}

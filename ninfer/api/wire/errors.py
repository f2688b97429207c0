"""Typed HTTP API errors and the OpenAI error body.

Every error a client can cause through the HTTP API is an `ApiError`: an HTTP status, an
OpenAI error `type`, a stable machine `code`, the offending request field (`param`, a dotted /
indexed path such as ``messages[2].content[0].image_url.detail``) and a one-line message that
says what was wrong. `ApiError.body()` is the OpenAI wire shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": "..."}}

Internal invariant failures are never `ApiError`s; the app answers them with a generic 500.
The helpers below are the only spellings of each code, so handlers and tests agree on them.
"""

from __future__ import annotations

import logging
from typing import Any

from ninfer.errors import NinferError

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"


class ApiError(NinferError):
    """A request the server refuses, with everything its HTTP error response needs.

    status: HTTP status code. type: OpenAI error type. code: stable machine-readable code.
    param: the request field at fault, or None when no single field is.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,  # the OpenAI field name
        code: str | None = None,
        param: str | None = None,
    ):
        message = clip_message(message)  # client values echoed in it stay bounded
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return (
            f"ApiError({self.status}, code={self.code!r}, param={self.param!r}, {self.message!r})"
        )


MAX_MESSAGE_CHARS = 600  # an error message longer than this is cut in the middle
MAX_ECHO_CHARS = 60  # a client value quoted in a message is cut to this


def clip(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """A client value as JSON text, cut to `limit` characters (for quoting it in a message)."""
    return _short(value, limit)


def clip_message(message: str) -> str:
    """`message` cut in the middle to MAX_MESSAGE_CHARS, so that a value a handler quotes
    whole (a tool name, an id, a path) cannot make an error of unbounded size."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 4
    return (
        f"{message[:head]} [... {len(message) - head - tail} characters cut ...] {message[-tail:]}"
    )


# -- 400: malformed or unsupported requests -----------------------------------------------------


def invalid_json(detail: str) -> ApiError:
    """The body is not a JSON object."""
    return ApiError(400, f"the request body is not valid JSON: {detail}", code="invalid_json")


def missing(param: str) -> ApiError:
    """A required field is absent or null."""
    return _field_error("missing_required_parameter", param, f"'{param}' is required")


def invalid_tool_history(param: str | None, message: str) -> ApiError:
    """Tool results that do not answer the tool calls before them (Chat and Responses)."""
    return ApiError(400, message, code="invalid_tool_history", param=param)


def invalid_type(param: str, expected: str, value: object) -> ApiError:
    """A field has the wrong JSON type."""
    return _field_error(
        "invalid_type", param, f"'{param}' must be {expected}, got {_json_type(value)}"
    )


def invalid_value(param: str, message: str) -> ApiError:
    """A field has the right type but an impossible value (out of range, unknown enum member)."""
    return _field_error("invalid_value", param, f"'{param}': {message}")


def unsupported_parameter(param: str, guarantee: str) -> ApiError:
    """A field whose requested behaviour NInfer cannot provide, whatever its value.

    `guarantee` names what cannot be honoured, e.g. "grammar-constrained decoding".
    """
    return _field_error("unsupported_parameter", param, f"'{param}' {_cannot(guarantee)}")


def unsupported_value(param: str, value: object, guarantee: str) -> ApiError:
    """A supported field given a value whose behaviour NInfer cannot provide."""
    return _field_error(
        "unsupported_value", param, f"'{param}' = {_short(value)} {_cannot(guarantee)}"
    )


def vision_disabled(param: str) -> ApiError:
    """Media input on a server started without --vision."""
    return _field_error(
        "vision_disabled",
        param,
        "image and video input is disabled on this server; start `ninfer serve` with --vision",
    )


def invalid_media(param: str, message: str) -> ApiError:
    """An invalid media source, bytes or decoded content."""
    return _field_error("invalid_media", param, f"'{param}': {message}")


def conflicting_template_option(param: str, message: str) -> ApiError:
    """Two request fields (typed and chat_template_kwargs, or thinking and effort) disagree."""
    return _field_error("conflicting_template_option", param, message)


def context_length_exceeded(
    prompt_tokens: int, max_context: int, param: str | None = "messages"
) -> ApiError:
    """The rendered prompt does not fit the per-sequence context ceiling (--max-context)."""
    return ApiError(
        400,
        f"the prompt has {prompt_tokens} tokens, more than this server's context of {max_context} "
        f"tokens (--max-context); shorten the conversation",
        code="context_length_exceeded",
        param=param,
    )


# -- other statuses ------------------------------------------------------------------------------


def unauthorized() -> ApiError:
    """Missing or wrong API key (--api-key)."""
    return ApiError(
        401,
        "missing or invalid API key; send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        type=AUTHENTICATION,
        code="invalid_api_key",
    )


def model_not_found(model: str, served: str) -> ApiError:
    """A request or lookup names a model other than the public model id."""
    return ApiError(
        404,
        f"the model {clip(model)} does not exist; this server serves {served!r}",
        code="model_not_found",
        param="model",
    )


def route_not_found(method: str, path: str) -> ApiError:
    return ApiError(
        404, f"no route for {clip(method, 20)} {clip(path)}", type=NOT_FOUND, code="not_found"
    )


def method_not_allowed(method: str, path: str) -> ApiError:
    return ApiError(
        405, f"{clip(method, 20)} is not allowed on {clip(path)}", code="method_not_allowed"
    )


def request_too_large(limit_mib: int) -> ApiError:
    """The raw body exceeds --max-request-mib (checked before JSON parsing)."""
    return ApiError(
        413,
        f"the request body is larger than this server's limit of {limit_mib} MiB (--max-request-mib)",
        code="request_too_large",
    )


def unsupported_media_type(message: str) -> ApiError:
    """A request body that is not plain application/json (ninfer.api.server.app.JsonOnly)."""
    return ApiError(415, message, code="unsupported_media_type")


def request_timeout(timeout_s: float) -> ApiError:
    """The request body did not arrive within --client-timeout-s."""
    return ApiError(
        408,
        f"the request body did not arrive within {timeout_s:g} s (--client-timeout-s)",
        code="request_timeout",
    )


CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request": nobody reads this answer


def client_closed() -> ApiError:
    """The client went away before its request was prepared (logged, never sent)."""
    return ApiError(
        CLIENT_CLOSED_STATUS,
        "the client closed the request during preparation",
        code="client_closed",
    )


def server_overloaded() -> ApiError:
    """max_concurrency + max_pending_requests requests are already outstanding."""
    return ApiError(
        429,
        "the server is at capacity (--max-concurrency + --max-pending-requests); retry later",
        type=RATE_LIMIT,
        code="server_overloaded",
    )


def request_queue_timeout(timeout_ms: int) -> ApiError:
    """Admission did not happen within --pending-timeout-ms."""
    return ApiError(
        503,
        f"the request was not admitted within {timeout_ms} ms (--pending-timeout-ms); retry later",
        type=SERVER_ERROR,
        code="request_queue_timeout",
    )


def engine_unavailable() -> ApiError:
    """The engine failed engine-wide and accepts no more work."""
    return ApiError(
        503,
        "the engine has failed and accepts no requests",
        type=SERVER_ERROR,
        code="engine_unavailable",
    )


def server_shutting_down() -> ApiError:
    """The server is stopping (SIGTERM) and ended this request after its grace period."""
    return ApiError(
        503,
        "the server is shutting down and ended this request; retry against a running server",
        type=SERVER_ERROR,
        code="server_shutting_down",
    )


def internal_error() -> ApiError:
    """An internal failure; the message deliberately carries no detail."""
    return ApiError(500, "internal server error", type=SERVER_ERROR, code="internal_error")


# -- formatting ----------------------------------------------------------------------------------


def _field_error(code: str, param: str, message: str) -> ApiError:
    """A 400 invalid_request_error blaming one request field."""
    return ApiError(400, message, code=code, param=param)


def _cannot(guarantee: str) -> str:
    return f"is not supported: ninfer cannot provide {guarantee}"


# JSON's types as an error message names them; bool before int (a bool is an int in Python)
_JSON_TYPES = (
    (type(None), "null"),
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)


def _json_type(value: object) -> str:
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _short(value: object, limit: int = 60) -> str:
    import json

    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def from_engine_error(exc: BaseException, *, pending_timeout_ms: int) -> ApiError | None:
    """The API error for a typed engine refusal raised by `Engine.submit` or delivered in a
    FinishEvent: EngineOverloaded -> 429 server_overloaded, QueueTimeout -> 503
    request_queue_timeout, RequestError -> 400 invalid_request. Anything else (an engine
    failure, a bug) returns None: the caller must not relabel it as a client error."""
    from ninfer.runtime.request import EngineOverloaded, QueueTimeout, RequestError

    if isinstance(exc, EngineOverloaded):
        return server_overloaded()
    if isinstance(exc, QueueTimeout):
        return request_queue_timeout(pending_timeout_ms)
    if isinstance(exc, RequestError):
        return ApiError(400, str(exc), code="invalid_request")
    return None


def generation_failure(cause: BaseException | None, *, pending_timeout_ms: int) -> ApiError:
    """The API error of a generation that failed after it started: an ApiError as it is, a typed
    engine refusal mapped by `from_engine_error`, anything else (logged) 500 internal_error."""
    if isinstance(cause, ApiError):
        return cause
    if cause is not None:
        mapped = from_engine_error(cause, pending_timeout_ms=pending_timeout_ms)
        if mapped is not None:
            return mapped
        logging.getLogger("ninfer.serve").error("generation failed", exc_info=cause)
    return internal_error()

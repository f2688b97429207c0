"""The Litestar application: routes, authentication, CORS, request ids, body limits, errors.

`create_app(state)` builds the app around one `ServerState`. Around Litestar's own handler it
adds plain ASGI layers, outermost first, so that they cover every response — matched
routes, unknown routes, errors and streams alike:

    RequestId      a unique id per HTTP request in scope["state"]["request_id"]; the
                   `x-request-id` header on every response, `request-id` instead on the
                   Anthropic endpoints (/v1/messages...), both on /v1/models... asked with
                   an anthropic-version header; a handler that sets the header
                   itself keeps its value
    PermissiveCors (--cors) preflight answered here with everything allowed; any origin, and
                   the request-id headers exposed, on every response (401/413 included)
    ApiKeyAuth     (--api-key) Bearer or x-api-key, compared in constant time; /health and
                   CORS preflight (OPTIONS + Access-Control-Request-Method) pass unauthenticated
    JsonOnly       a body must be application/json without a content coding (415 otherwise),
                   so that a browser page cannot post to the API without a CORS preflight
    BodyLimit      a body over --max-request-mib is answered 413 request_too_large before any
                   handler parses it (Content-Length checked first, chunked bodies counted);
                   at most max_concurrency + max_pending_requests + 1 bodies are held at
                   once (429 beyond), each within --client-timeout-s (408)
    HeadAsGet      HEAD is answered as GET without its body, on every resource
    UnversionedAliases  /chat/completions, /responses..., /models... served as their /v1
                   paths (route_aliases), as llama.cpp's server offers

Error bodies use the OpenAI shape (`ApiError.body()`), and the Anthropic shape on the Anthropic
endpoints and on the Models API asked by an Anthropic client (`anthropic_errors`), app-level
401/413/404 included; a 405 carries Allow; internal failures become a
generic 500 and are logged with their traceback.

Endpoints here: GET /health, GET /v1/models, GET /v1/models/{id}. Protocol endpoints live in
their own modules and are registered through `PROTOCOL_MODULES` (see there). A handler reads
the request id as `request.state.request_id`, the raw body with `await request.body()` (then
`fields.parse_json_object`, so that malformed JSON is a 400 invalid_json in the OpenAI shape),
and the server through `request.app.state.server` or the `state` its module was built with.
"""

from __future__ import annotations

import hmac
import importlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.exceptions import HTTPException, NotFoundException
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from ninfer.api.server.body_layers import BodyLimit, JsonOnly
from ninfer.api.server.error_response import error_headers, send_error
from ninfer.api.server.route_aliases import UnversionedAliases
from ninfer.api.server.state import ServerState
from ninfer.api.wire import errors
from ninfer.api.wire.anthropic_errors import (
    anthropic_error_body,
    is_anthropic_path,
    is_anthropic_request,
)
from ninfer.api.wire.errors import ApiError

log = logging.getLogger("ninfer.api")

# Protocol endpoint modules, registered in this order. Each module defines
#
#     def route_handlers(state: ServerState) -> list[litestar.handlers.BaseRouteHandler]
#
# returning its handlers (e.g. POST /v1/chat/completions). A module that does not exist yet is
# skipped; any other import error propagates.
PROTOCOL_MODULES: tuple[str, ...] = (
    "ninfer.api.chat.endpoints",  # POST /v1/chat/completions
    "ninfer.api.responses.endpoints",  # /v1/responses...
    "ninfer.api.anthropic.endpoints",  # POST /v1/messages, /v1/messages/count_tokens
    "ninfer.api.chat.tokenize",  # POST /tokenize, /detokenize (llama.cpp and vLLM shapes)
)

UNAUTHENTICATED_PATHS = frozenset({"/health"})
ANTHROPIC_PREFIX = "/v1/messages"
REQUEST_ID_HEADER = b"x-request-id"


def create_app(
    state: ServerState,
    *,
    protocol_modules: Sequence[str] = PROTOCOL_MODULES,
    extra_handlers: Sequence[BaseRouteHandler] = (),
) -> Litestar:
    """The ASGI app serving `state`. `extra_handlers` are registered after the protocol
    modules' handlers (tests use it to mount probe endpoints)."""
    handlers: list[Any] = [*_shell_handlers(state)]
    for name in protocol_modules:
        module = _import_optional(name)
        if module is not None:
            handlers.extend(module.route_handlers(state))
    handlers.extend(extra_handlers)
    cfg = state.config
    app = Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: _handle_exception},
        request_max_body_size=None,  # BodyLimit enforces --max-request-mib before routing
        logging_config=None,
        openapi_config=None,
        debug=False,
    )
    app.state.server = state
    # Outer layers around Litestar's handler, innermost first (see the module docstring).
    inner: ASGIApp = BodyLimit(
        HeadAsGet(UnversionedAliases(app.asgi_handler)),
        cfg.max_request_bytes,
        cfg.max_request_mib,
        slots=cfg.engine.max_concurrency + cfg.engine.max_pending_requests + 1,
        timeout_s=cfg.client_timeout_s,
    )
    inner = JsonOnly(inner)
    if cfg.api_key is not None:
        inner = ApiKeyAuth(inner, cfg.api_key)
    if cfg.cors:
        inner = PermissiveCors(inner)
    app.asgi_handler = RequestId(inner)
    return app


def _import_optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


# -----------------------------------------------------------------------------------------------
# Shell endpoints
# -----------------------------------------------------------------------------------------------


def _shell_handlers(state: ServerState) -> list[BaseRouteHandler]:
    def model_card() -> dict[str, Any]:
        # OpenAI's model object, plus the fields Anthropic's Models API has at the same path
        # (type, display_name, created_at), so that either SDK reads a whole object
        created_at = datetime.fromtimestamp(state.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "ninfer",
            "max_model_len": state.max_model_len,
            "type": "model",
            "display_name": state.model_id,
            "created_at": created_at,
        }

    @get("/health", sync_to_thread=False)
    def health() -> Response[dict[str, str]]:
        """Engine readiness: 200 ok while it can accept work, 503 after an engine-wide failure."""
        if state.healthy():
            return Response({"status": "ok"}, status_code=200)
        return Response({"status": "unavailable"}, status_code=503)

    @get("/v1/models", sync_to_thread=False)
    def list_models() -> dict[str, Any]:
        card = model_card()  # one page, in OpenAI's and Anthropic's list shapes
        return {
            "object": "list",
            "data": [card],
            "has_more": False,
            "first_id": card["id"],
            "last_id": card["id"],
        }

    @get("/v1/models/{model:path}", sync_to_thread=False)
    def get_model(model: FromPath[str]) -> dict[str, Any]:
        name = model.lstrip("/")
        if name != state.model_id:
            raise errors.model_not_found(name, state.model_id)
        return model_card()

    return [health, list_models, get_model]


# -----------------------------------------------------------------------------------------------
# Errors
# -----------------------------------------------------------------------------------------------


def _handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Every exception a handler raises becomes an OpenAI-shaped error response."""
    extra: dict[str, str] = {}
    if isinstance(exc, ApiError):
        err = exc
    elif isinstance(exc, NotFoundException):
        err = errors.route_not_found(request.method, request.url.path)
    elif isinstance(exc, HTTPException) and exc.status_code == 405:
        err = errors.method_not_allowed(request.method, request.url.path)
        extra = _allow_header(exc.headers or {})
    elif isinstance(exc, HTTPException) and exc.status_code < 500:
        err = ApiError(exc.status_code, str(exc.detail), code="invalid_request")
    else:
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        err = errors.internal_error()
    if is_anthropic_request(request.scope):
        rid = request.scope.get("state", {}).get("request_id")
        status, body = anthropic_error_body(err, rid)
        return Response(body, status_code=status, headers=extra)
    return Response(err.body(), status_code=err.status, headers=error_headers(err) | extra)


def _allow_header(headers: Mapping[str, str]) -> dict[str, str]:
    """The Allow header of a 405 (RFC 9110: it lists the methods the resource has), HEAD
    among them wherever GET is (HeadAsGet answers it)."""
    allow = {k.lower(): v for k, v in headers.items()}.get("allow")
    if allow is None:
        return {}
    methods = [m.strip() for m in allow.split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.insert(methods.index("GET") + 1, "HEAD")
    return {"allow": ", ".join(methods)}


# -----------------------------------------------------------------------------------------------
# ASGI layers
# -----------------------------------------------------------------------------------------------


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex


class HeadAsGet:
    """HEAD on any resource is its GET without the body (RFC 9110: a server supporting GET
    supports HEAD), status and headers as GET answers them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        done = False

        async def send_headers_only(message: Message) -> None:
            nonlocal done
            if message["type"] == "http.response.body":
                if done or message.get("more_body", False):
                    return
                done = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)  # type: ignore[arg-type]


class RequestId:
    """Adds a unique request id (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = new_request_id()
        scope.setdefault("state", {})["request_id"] = rid  # type: ignore[typeddict-unknown-key]
        names = [REQUEST_ID_HEADER]  # the Models API serves both protocols: both for Anthropic
        if is_anthropic_request(scope):
            names = [b"request-id"] if is_anthropic_path(scope["path"]) else [*names, b"request-id"]
        value = rid.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                for name in names:
                    if not any(k.lower() == name for k, _ in headers):
                        headers.append((name, value))
                message = {**message, "headers": headers}  # type: ignore[assignment]
            await send(message)

        await self.app(scope, receive, send_with_id)


def is_preflight(scope: Scope) -> bool:
    """A CORS preflight: OPTIONS carrying Access-Control-Request-Method."""
    return scope["method"] == "OPTIONS" and any(
        k.lower() == b"access-control-request-method" for k, _ in scope.get("headers", ())
    )


class ApiKeyAuth:
    """Requires --api-key as `Authorization: Bearer KEY` or `x-api-key: KEY` (401 otherwise)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED_PATHS or is_preflight(scope):
            await self.app(scope, receive, send)
            return
        if self.authorized(scope):
            await self.app(scope, receive, send)
            return
        await send_error(send, errors.unauthorized(), scope)

    def authorized(self, scope: Scope) -> bool:
        ok = False
        for name, value in scope.get("headers", ()):
            name = name.lower()
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    ok |= hmac.compare_digest(token.strip(), self._key)
            elif name == b"x-api-key":
                ok |= hmac.compare_digest(value.strip(), self._key)
        return ok


class PermissiveCors:
    """--cors: allow every origin, method and header.

    A preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered 204 here,
    never reaching authentication; any other request with an Origin gets
    Access-Control-Allow-Origin: * and the request-id headers exposed.
    """

    EXPOSE = b"x-request-id, request-id"

    def __init__(self, app: ASGIApp, max_age_s: int = 600) -> None:
        self.app = app
        self.max_age = str(max_age_s).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        if b"origin" not in headers:
            await self.app(scope, receive, send)
            return
        if is_preflight(scope):
            allow_headers = headers.get(b"access-control-request-headers", b"*")
            out = [
                (b"access-control-allow-origin", b"*"),
                (b"access-control-allow-methods", b"GET, POST, PUT, PATCH, DELETE, OPTIONS, HEAD"),
                (b"access-control-allow-headers", allow_headers),
                (b"access-control-max-age", self.max_age),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": out})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                hs = [
                    h
                    for h in message.get("headers", ())
                    if h[0].lower() != b"access-control-allow-origin"
                ]
                hs += [
                    (b"access-control-allow-origin", b"*"),
                    (b"access-control-expose-headers", self.EXPOSE),
                ]
                message = {**message, "headers": hs}  # type: ignore[assignment]
            await send(message)

        await self.app(scope, receive, send_with_cors)

"""OpenAI Responses Core over the model service (docs/serving.md, "OpenAI Responses").

Routes:

    POST   /v1/responses                      create (JSON, or semantic SSE with stream:true)
    POST   /v1/responses/input_tokens         prompt-token count through the same prompt path
    GET    /v1/responses/{id}                 the stored terminal Response
    DELETE /v1/responses/{id}                 remove it (descendants keep their own context)
    GET    /v1/responses/{id}/input_items     its normalized input Items (after, limit, order)
    POST   /v1/responses/{id}/cancel          fails: no background execution
    POST   /v1/responses/compact              fails: compaction_not_supported

A create request is validated (`request`), its parent chain fetched from the local
store, the chain's Items plus the new input lowered to template messages (`prepare`),
and the resulting `GenerationRequest` run by `ModelService`. `OutputBuilder` turns the event
stream into output Items for both the JSON body and the SSE stream. Preparation and admission
errors are ordinary HTTP errors: the stream starts only after the first event. A stored root
Response's chain gets the engine session key "resp:<root id>"; children inherit it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.background_tasks import BackgroundTask
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.response import Stream

from ninfer.api.responses.prepare import (
    SESSION_PREFIX,
    Prepared,
    envelope_size,
    prepare,
    response_object,
    usage_dict,
)
from ninfer.api.responses.reasoning_seal import ReasoningSeal, configured_key
from ninfer.api.responses.request import parse_count_request, parse_create_request
from ninfer.api.responses.sse import STATUS, OutputBuilder, SseFramer
from ninfer.api.responses.store import (
    json_size,
    list_page,
    make_record,
    query_int,
    query_truthy,
    response_not_found,
    response_store,
)
from ninfer.api.server.disconnect import unless_disconnected
from ninfer.api.server.sse import first_event, generation_closer, open_events, with_keepalive
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import Finished, GenerationEvent, GenerationRequest
from ninfer.api.wire import errors
from ninfer.api.wire.errors import CLIENT_CLOSED_STATUS, ApiError
from ninfer.api.wire.offload import decode_body

log = logging.getLogger("ninfer.api.responses")

__all__ = [  # the preparation half lives in prepare.py; tests import it from here too
    "SESSION_PREFIX",
    "Prepared",
    "envelope_size",
    "list_page",
    "prepare",
    "response_object",
    "response_store",
    "route_handlers",
    "usage_dict",
]


def _service(state: ServerState) -> Any:
    service = state.extra.get("service") or getattr(state, "service", None)
    if service is None:
        raise errors.engine_unavailable()
    return service


def reasoning_seal(state: ServerState) -> ReasoningSeal:
    """The server's reasoning-token seal (reasoning_seal), made on first use from
    --reasoning-key-file / NINFER_REASONING_KEY_FILE, else a random key for this process."""
    seal = state.extra.get("reasoning_seal")
    if seal is None:
        key_file = getattr(state.config, "reasoning_key_file", None)
        seal = state.extra["reasoning_seal"] = ReasoningSeal(
            configured_key(key_file), state.model_id
        )
    return seal


def _builder(state: ServerState, p: Prepared) -> OutputBuilder:
    seal = reasoning_seal(state).seal if p.req.include_reasoning else None
    return OutputBuilder(p.req.tools, seal=seal)


def _store_result(state: ServerState, p: Prepared, obj: dict[str, Any]) -> None:
    """Store a terminal completed/incomplete Response (store:true); raises capacity_exceeded."""
    stored = obj["status"] in ("completed", "incomplete")
    if not p.req.store or not stored or not response_store(state).end(p.response_id):
        return  # not asked, not terminal, or deleted while it ran
    record = make_record(
        obj,
        p.req.input_items,
        p.parent,
        preserve_thinking=p.options.preserve_thinking,
        session_key=p.session_key,
    )
    try:
        response_store(state).put(record)
    except ApiError as e:  # a failure after the generation's outcome
        for track in p.tracks:
            track.raised(e)  # counted in ninfer_response_failures_total
        raise


def _precheck_store(state: ServerState, p: Prepared, model: str) -> None:
    """Refuse before generating when the chain and input alone exceed the store."""
    if not p.req.store:
        return
    base = p.parent.context_bytes if p.parent is not None else 0
    envelope = envelope_size(p, model)
    response_store(state).check_fits(base + envelope + sum(json_size(i) for i in p.req.input_items))


def _failure(fin: Finished | None, exc: BaseException | None, pending_timeout_ms: int) -> ApiError:
    """The API error of a generation that failed after it started."""
    cause = exc if exc is not None else (fin.error if fin is not None else None)
    return errors.generation_failure(cause, pending_timeout_ms=pending_timeout_ms)


# -----------------------------------------------------------------------------------------------
# Create: JSON and SSE
# -----------------------------------------------------------------------------------------------


async def _create_json(
    state: ServerState, p: Prepared, first: GenerationEvent, events: AsyncIterator[GenerationEvent]
) -> dict[str, Any]:
    created = int(time.time())
    builder = _builder(state, p)
    fin: Finished | None = None
    async for ev in _chain(first, events):
        if isinstance(ev, Finished):
            fin = ev
            builder.finish(ev)
            break
        builder.feed(ev)
    if fin is None or STATUS[fin.reason] == "failed":
        raise _failure(fin, None, state.config.engine.pending_timeout_ms)
    obj = response_object(
        p, created, STATUS[fin.reason], builder.output, usage=usage_dict(fin), model=state.model_id
    )
    _store_result(state, p, obj)
    return obj


async def _create_sse(
    state: ServerState,
    p: Prepared,
    first: GenerationEvent,
    events: AsyncIterator[GenerationEvent],
) -> AsyncIterator[bytes]:
    """Semantic events of one streamed Response; closing it cancels the generation. `first` is
    the first generation event (the stream opens at admission, `sse.open_events`); a failure
    after it ends the stream in response.failed."""
    created = int(time.time())
    framer = SseFramer()
    builder = _builder(state, p)
    start = response_object(p, created, "in_progress", [], model=state.model_id)
    yield framer.frame({"type": "response.created", "response": start})
    yield framer.frame({"type": "response.in_progress", "response": start})
    fin: Finished | None = None
    failure: ApiError | None = None
    try:
        async for ev in _chain(first, events):
            if isinstance(ev, Finished):
                fin = ev
                for out in builder.finish(ev):
                    yield framer.frame(out)
                break
            for out in builder.feed(ev):
                yield framer.frame(out)
    except ApiError as e:
        failure = e
    except Exception as e:  # noqa: BLE001 - after the stream started, report; never leak detail
        failure = _failure(None, e, state.config.engine.pending_timeout_ms)
    finally:
        await events.aclose()  # a client that hung up cancels its generation
    if fin is not None and fin.reason == "cancelled":
        return
    if failure is None and (fin is None or STATUS[fin.reason] == "failed"):
        failure = _failure(fin, None, state.config.engine.pending_timeout_ms)
    usage = usage_dict(fin) if fin is not None else None
    if failure is None and fin is not None:
        obj = response_object(
            p, created, STATUS[fin.reason], builder.output, usage=usage, model=state.model_id
        )
        try:
            _store_result(state, p, obj)
        except ApiError as e:
            failure = e
        else:
            yield framer.frame({"type": f"response.{obj['status']}", "response": obj})
            return
    assert failure is not None
    error = {"code": failure.code or "server_error", "message": failure.message}
    obj = response_object(
        p, created, "failed", builder.output, usage=usage, error=error, model=state.model_id
    )
    yield framer.frame({"type": "response.failed", "response": obj})


async def _chain(
    first: GenerationEvent, rest: AsyncIterator[GenerationEvent]
) -> AsyncIterator[GenerationEvent]:
    yield first
    async for ev in rest:
        yield ev


# -----------------------------------------------------------------------------------------------
# Routes
# -----------------------------------------------------------------------------------------------


async def _decode(
    state: ServerState, request: Request[Any, Any, Any], parse: Callable[..., Any]
) -> Any:
    """The request body decoded and parsed by `parse` (a Responses request parser) for this
    server's model, --vision setting and reasoning seal."""
    screened = screened_create if parse is parse_create_request else screened_count
    return await decode_body(
        request, lambda body: _parse(state, body, parse), screen=state.screen(screened)
    )


def _parse(state: ServerState, body: dict[str, Any], parse: Callable[..., Any]) -> Any:
    return parse(
        body, model_id=state.model_id, vision=state.config.vision, seal=reasoning_seal(state)
    )


def screened_create(state: ServerState, body: dict[str, Any]) -> GenerationRequest:
    """The GenerationRequest /v1/responses prepares for `body` (for the body-screening worker,
    ninfer.api.service.body_screen)."""
    return prepare(state, _parse(state, body, parse_create_request)).generation


def screened_count(state: ServerState, body: dict[str, Any]) -> GenerationRequest:
    """The GenerationRequest /v1/responses/input_tokens counts for `body` (for the
    body-screening worker)."""
    return prepare(state, _parse(state, body, parse_count_request)).generation


def route_handlers(state: ServerState) -> list[BaseRouteHandler]:
    @post("/v1/responses", status_code=200)
    async def create(request: Request[Any, Any, Any]) -> Response[Any]:
        req = await _decode(state, request, parse_create_request)
        p = prepare(state, req)
        _precheck_store(state, p, state.model_id)
        if req.store:
            response_store(state).begin(p.response_id)  # retrievable once it ends
        ended = functools.partial(response_store(state).end, p.response_id)
        rid = getattr(request.state, "request_id", "")
        events = _service(state).generate(
            p.generation, request_id=rid, tracks=p.tracks, on_sampling=p.record_sampling
        )
        if not req.stream:

            async def aggregate() -> dict[str, Any]:
                first = await first_event(events)  # preparation/admission errors raise here
                return await _create_json(state, p, first, events)

            try:
                obj = await unless_disconnected(aggregate(), request, events)
            finally:
                await events.aclose()
                ended()
            if obj is None:  # the client went away; nobody reads this
                return Response({}, status_code=CLIENT_CLOSED_STATUS)
            return Response(obj)
        try:
            first_or_wait = await open_events(events, request)  # refusals are HTTP errors
        except BaseException:
            ended()
            raise
        if first_or_wait is None:  # the client went away before admission
            ended()
            return Response({}, status_code=CLIENT_CLOSED_STATUS)
        return Stream(
            with_keepalive(_create_sse(state, p, first_or_wait, events)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(generation_closer(events, after=ended)),
        )

    @post("/v1/responses/input_tokens", status_code=200)
    async def input_tokens(request: Request[Any, Any, Any]) -> dict[str, Any]:
        req = await _decode(state, request, parse_count_request)
        p = prepare(state, req)
        # rendering and tokenising run in a thread: on the event loop they stalled every
        # connection for seconds on a large input
        count = await _service(state).count_prompt_tokens(p.generation)
        return {"object": "response.input_tokens", "input_tokens": count}

    @post("/v1/responses/compact", status_code=200)
    async def compact() -> None:
        raise ApiError(
            400,
            "response compaction is not supported: ninfer keeps the full Item history of a chain",
            code="compaction_not_supported",
        )

    @get("/v1/responses/{response_id:str}", sync_to_thread=False)
    def retrieve(request: Request[Any, Any, Any], response_id: FromPath[str]) -> dict[str, Any]:
        q = request.query_params
        if query_truthy(q.get("stream")):
            raise errors.unsupported_value("stream", True, "stream recovery of a finished response")
        if q.get("starting_after") is not None:
            raise errors.unsupported_parameter(
                "starting_after", "stream recovery of a finished response"
            )
        include = [v for k in ("include", "include[]") for v in q.getall(k, [])]
        if any(include):
            raise errors.unsupported_value("include", include, "extra included output data")
        return response_store(state).require(response_id).response

    @delete("/v1/responses/{response_id:str}", status_code=200, sync_to_thread=False)
    def remove(response_id: FromPath[str]) -> dict[str, Any]:
        if not response_store(state).delete(response_id):
            raise response_not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @get("/v1/responses/{response_id:str}/input_items", sync_to_thread=False)
    def input_items(request: Request[Any, Any, Any], response_id: FromPath[str]) -> dict[str, Any]:
        q = request.query_params
        rec = response_store(state).require(response_id)
        limit = query_int(q.get("limit"), "limit", 20, 1, 100)
        order = q.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise errors.invalid_value("order", f"must be 'asc' or 'desc', got {order!r}")
        include = [v for k in ("include", "include[]") for v in q.getall(k, [])]
        if any(include):
            raise errors.unsupported_value("include", include, "extra included item data")
        return list_page(list(rec.input_items), after=q.get("after"), limit=limit, order=order)

    @post("/v1/responses/{response_id:str}/cancel", status_code=200, sync_to_thread=False)
    def cancel(response_id: FromPath[str]) -> None:
        response_store(state).require(response_id)
        raise ApiError(
            400,
            "only background responses can be cancelled, and ninfer does not run background "
            "responses; this response has already finished",
            code="background_not_supported",
        )

    return [create, input_tokens, compact, retrieve, remove, input_items, cancel]

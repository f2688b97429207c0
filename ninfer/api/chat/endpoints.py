"""POST /v1/chat/completions: OpenAI Chat Completions over the model service.

Aggregate responses carry `message.reasoning_content`, `tool_calls`, usage with cached and
reasoning token details, and llama.cpp-compatible `timings`. Streams send an assistant-role
chunk, separate reasoning / content / tool-call deltas, a finish-reason chunk, an optional
usage chunk (`stream_options.include_usage`), then `[DONE]`; `timings` rides on the last JSON
chunk; with `stream_options.include_usage` every other chunk carries `"usage": null`.
Preparation and admission errors are HTTP errors (429/503/400 are real statuses, however long
the request waited): the stream starts at admission, and a failure after that is an in-stream
`{"error": ...}` chunk before `[DONE]` (docs/serving.md, "Streams and status codes").
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.handlers import BaseRouteHandler
from litestar.response import Stream

from ninfer.api.chat.choices import ChoiceEvent, choice_request, fan_out
from ninfer.api.chat.request import ChatRequest, parse_chat_request
from ninfer.api.server.disconnect import unless_disconnected
from ninfer.api.server.sse import (
    first_event,
    generation_closer,
    open_events,
    with_keepalive,
)
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import (
    Admitted,
    ContentText,
    Finished,
    GenerationEvent,
    GenerationRequest,
    PromptProgress,
    ReasoningText,
    ToolCallArgs,
    ToolCallStart,
)
from ninfer.api.service.template_options import ThinkingDefaults, resolve_template_options
from ninfer.api.wire import errors
from ninfer.api.wire.errors import CLIENT_CLOSED_STATUS
from ninfer.api.wire.offload import decode_body


def to_generation_request(chat: ChatRequest, state: ServerState) -> GenerationRequest:
    config = state.config
    options = resolve_template_options(
        enable_thinking=chat.enable_thinking,
        preserve_thinking=chat.preserve_thinking,
        reasoning_effort=chat.reasoning_effort,
        chat_template_kwargs=chat.chat_template_kwargs,
        defaults=ThinkingDefaults.from_flags(config.thinking, config.preserve_thinking),
    )
    callable_tools = [t.template_dict() for t in chat.callable_tools]
    return GenerationRequest(
        messages=chat.template_messages(),
        tools=chat.template_tools(),
        parse_tools=bool(callable_tools),
        callable_tools=callable_tools,  # every declared tool is in the prompt; these parse
        template_options=options,
        sampling=chat.sampling,  # top_p 0 resolves to argmax in ninfer.api.service.sampling
        max_tokens=chat.max_tokens,
        stop=chat.stop,
        cache_points=chat.explicit_cache_points,
        implicit_cache_point=chat.prompt_cache_mode == "implicit",
        protocol="chat",
        stream=chat.stream,
        ignore_eos=chat.ignore_eos,
        logprobs=chat.logprobs,
        constraint=chat.constraint,
    )


def screened_generation(state: ServerState, body: dict[str, Any]) -> GenerationRequest:
    """The GenerationRequest the handler prepares for `body`: what the body-screening worker
    prepares for a large body (ninfer.api.service.body_screen)."""
    return to_generation_request(_parse(state, body), state)


def _parse(state: ServerState, body: dict[str, Any]) -> ChatRequest:
    return parse_chat_request(body, model_id=state.model_id, vision=state.config.vision)


def _usage(finals: list[Finished]) -> dict[str, Any]:
    """The usage of one or more choices of the same prompt: the prompt (and its cached part,
    choice 0's) counted once, completion and reasoning tokens summed."""
    u = finals[0].usage
    completion = sum(f.usage.completion_tokens for f in finals)
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": u.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": sum(f.usage.reasoning_tokens for f in finals)
        },
    }


def _finish_reason(f: Finished) -> str:
    if f.reason in ("stop", "length", "tool_calls"):
        return f.reason
    return "stop"


def _tool_call_dict(call: Any) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


class ChatCompletion:
    """Serialises one completion's events (aggregate or stream)."""

    def __init__(self, state: ServerState, chat: ChatRequest) -> None:
        self.id = "chatcmpl-" + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = state.model_id
        self.chat = chat
        self.pending_timeout_ms = state.config.engine.pending_timeout_ms

    def _logprobs(self, entries: tuple[dict[str, Any], ...] | None) -> dict[str, Any] | None:
        if self.chat.logprobs is None:
            return None
        return {"content": list(entries or ()), "refusal": None}

    def aggregate(self, finals: list[Finished]) -> dict[str, Any]:
        """The completion of every choice's Finished, in choice order."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(i, f) for i, f in enumerate(finals)],
            "usage": _usage(finals),
            "timings": finals[0].timings.as_dict(),
        }

    def _choice(self, index: int, f: Finished) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f.content if (f.content or not f.tool_calls) else None,
        }
        if f.reasoning:
            message["reasoning_content"] = f.reasoning
        if f.tool_calls:
            message["tool_calls"] = [_tool_call_dict(c) for c in f.tool_calls]
        message["refusal"] = None
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(f.logprobs),
            "finish_reason": _finish_reason(f),
        }

    def chunk(
        self,
        delta: dict[str, Any] | None,
        finish_reason: str | None = None,
        *,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": []
            if delta is None
            else [
                {
                    "index": index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                }
            ],
        }
        if self.chat.include_usage:  # OpenAI: every other chunk carries "usage": null
            out["usage"] = None
        out.update(extra)
        return out

    async def stream(
        self,
        first: GenerationEvent | ChoiceEvent,
        events: AsyncIterator[GenerationEvent] | AsyncIterator[ChoiceEvent],
    ) -> AsyncIterator[dict[str, Any]]:
        """Chunks of one streamed completion; closing it cancels the generation. `first` is
        the first event: the stream opens at admission (`sse.open_events`), so refusals before
        it are HTTP errors and only failures after it are in-stream error chunks. With n > 1
        the events are `ChoiceEvent`s and chunks carry each choice's index."""
        self._processed = -1  # the last prompt_progress sent: they never move backwards
        self._finals: dict[int, Finished] = {}
        try:
            for i in range(self.chat.n):
                yield self.chunk({"role": "assistant", "content": ""}, index=i)
            for out in self._on_choice(first):
                yield out
            try:
                async for e in events:
                    chunks = self._on_choice(e)
                    for out in chunks:
                        yield out
                    if any("error" in out for out in chunks):
                        return  # a failed choice fails the completion; the others are cancelled
            except errors.ApiError as e:  # a further choice refused after the stream began
                yield {"error": e.body()["error"]}
        finally:
            await events.aclose()  # a client that hung up cancels its generation

    def _on_choice(self, e: GenerationEvent | ChoiceEvent) -> list[dict[str, Any]]:
        if isinstance(e, ChoiceEvent):
            return self._on_event(e.event, e.index)
        return self._on_event(e)

    def _on_event(self, e: GenerationEvent, index: int = 0) -> list[dict[str, Any]]:
        chat = self.chat
        out: list[dict[str, Any]] = []
        if isinstance(e, Admitted):
            return out
        if isinstance(e, PromptProgress):
            if index != 0:  # the prompt's progress is choice 0's; the others reuse it
                return out
            # The engine's committed prefill progress: processed == cache at admission, then
            # once per committed chunk up to processed == total before the first output token.
            if chat.return_progress and e.processed >= self._processed:
                self._processed = e.processed
                progress = {
                    "total": e.total,
                    "cache": e.cache,
                    "processed": e.processed,
                    "time_ms": e.time_ms,
                }
                out.append(self.chunk(None, prompt_progress=progress))
            return out
        extra = (
            {"timings": e.timings.as_dict()}
            if chat.timings_per_token and getattr(e, "timings", None)
            else {}
        )
        if isinstance(e, ReasoningText):
            out.append(self.chunk({"reasoning_content": e.text}, index=index, **extra))
        elif isinstance(e, ContentText):
            lp = self._logprobs(e.logprobs)
            out.append(self.chunk({"content": e.text}, index=index, logprobs=lp, **extra))
        elif isinstance(e, ToolCallStart):
            out.append(
                self.chunk(
                    {
                        "tool_calls": [
                            {
                                "index": e.index,
                                "id": e.id,
                                "type": "function",
                                "function": {"name": e.name, "arguments": ""},
                            }
                        ]
                    },
                    index=index,
                )
            )
        elif isinstance(e, ToolCallArgs):
            call = {"index": e.index, "function": {"arguments": e.text}}
            out.append(self.chunk({"tool_calls": [call]}, index=index))
        elif isinstance(e, Finished):
            if e.reason == "error":
                failure = errors.generation_failure(
                    e.error, pending_timeout_ms=self.pending_timeout_ms
                )
                out.append({"error": failure.body()["error"]})
                return out
            self._finals[index] = e
            if len(self._finals) < chat.n:  # the last choice to finish ends the stream
                out.append(self.chunk({}, _finish_reason(e), index=index))
                return out
            finals = [self._finals[i] for i in range(chat.n)]
            timings = finals[0].timings.as_dict()
            if chat.include_usage:
                out.append(self.chunk({}, _finish_reason(e), index=index))
                out.append(self.chunk(None, usage=_usage(finals), timings=timings))
            else:
                out.append(self.chunk({}, _finish_reason(e), index=index, timings=timings))
        return out


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE frames of `chunks`, then `[DONE]`."""
    try:
        async for c in chunks:
            data = json.dumps(c, ensure_ascii=False, separators=(",", ":")).encode()
            yield b"data: " + data + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _last_event(events: AsyncIterator[GenerationEvent]) -> GenerationEvent:
    """The last event of a generation (its Finished); errors before the first raise."""
    final = await first_event(events)  # raises ApiError before any byte is sent
    async for e in events:
        final = e
    return final


async def _finals(events: AsyncIterator[ChoiceEvent], n: int) -> list[GenerationEvent]:
    """The last event of each of `n` choices, in choice order; a refusal of any raises."""
    finals: dict[int, GenerationEvent] = {}
    try:
        async for c in events:
            finals[c.index] = c.event
            if isinstance(c.event, Finished) and c.event.reason == "error":
                break  # the request fails
    finally:
        await events.aclose()  # (after a failure) cancels the other choices
    return [finals[i] for i in sorted(finals)]


def _check_choices(chat: ChatRequest, service: Any) -> None:
    """n beyond what the engine can ever hold outstanding is refused up front."""
    capacity = getattr(service, "capacity", None)
    if chat.n > 1 and capacity is not None and chat.n > capacity:
        raise errors.invalid_value(
            "n",
            f"asks for {chat.n} choices but the server holds at most {capacity} generations"
            " (--max-concurrency + --max-pending-requests)",
        )


def route_handlers(state: ServerState) -> list[BaseRouteHandler]:
    @post("/v1/chat/completions", status_code=200)
    async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
        chat = await decode_body(
            request,
            lambda body: _parse(state, body),
            screen=state.screen(screened_generation),
        )
        service = state.extra.get("service")
        if service is None:
            raise errors.engine_unavailable()
        _check_choices(chat, service)
        gen = to_generation_request(chat, state)
        request_id = getattr(request.state, "request_id", "")
        events: Any
        if chat.n == 1:
            events = service.generate(gen, request_id=request_id)
        else:
            events = fan_out(
                lambda c: service.generate(
                    choice_request(gen, c.index),
                    request_id=f"{request_id}:{c.index}" if c.index else request_id,
                    choice=c,
                ),
                chat.n,
            )
        completion = ChatCompletion(state, chat)
        if not chat.stream:
            work = _last_event(events) if chat.n == 1 else _finals(events, chat.n)
            finals = await unless_disconnected(work, request, events)
            if finals is None:  # the client went away; nobody reads this
                return Response({}, status_code=CLIENT_CLOSED_STATUS)
            finals = [finals] if chat.n == 1 else finals
            for final in finals:
                assert isinstance(final, Finished)
                if final.reason == "error":
                    raise errors.generation_failure(
                        final.error, pending_timeout_ms=state.config.engine.pending_timeout_ms
                    )
            return Response(completion.aggregate(finals))
        first = await open_events(events, request)  # refusals before admission raise here
        if first is None:  # the client went away before admission; nobody reads this
            return Response({}, status_code=CLIENT_CLOSED_STATUS)
        return Stream(
            with_keepalive(_sse(completion.stream(first, events))),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(generation_closer(events)),
        )

    return [chat_completions]

"""Responses preparation and the wire Response object.

`prepare` turns a validated `ResponsesRequest` plus its stored parent chain into the
`GenerationRequest` the model service runs; `response_object` renders the Response that the
JSON body, the SSE lifecycle events and the store all carry (see endpoints.py for routes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from ninfer.api.responses.history import has_user_message, items_to_messages
from ninfer.api.responses.items import check_unique_ids, new_id
from ninfer.api.responses.request import ResponsesRequest
from ninfer.api.responses.store import StoredResponse, json_size, response_store
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import Finished, GenerationRequest, SamplingOptions
from ninfer.api.service.observe import RequestTrack
from ninfer.api.service.template_options import (
    TemplateOptions,
    ThinkingDefaults,
    resolve_template_options,
)
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.runtime.request import SamplingParams

SESSION_PREFIX = "resp:"
# Response fields that echo the effective sampler (all required numbers in OpenResponses).
ECHOED_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


# -----------------------------------------------------------------------------------------------
# Preparation: request + stored chain -> GenerationRequest
# -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """Everything a create needs after validation: the generation, the parent record and the
    chain state to store with the result."""

    response_id: str
    req: ResponsesRequest
    parent: StoredResponse | None
    generation: GenerationRequest
    options: TemplateOptions
    session_key: str | None
    tracks: list[RequestTrack] = field(default_factory=list)  # told when storing fails
    # The sampling values the engine actually uses (request field, else process flag, else the
    # artifact's or architecture's default; --greedy): filled by `record_sampling` when the
    # service has prepared the request, before any generation event. The Response object echoes
    # them (OpenResponses requires the numbers used, never null).
    sampling: dict[str, float] = field(default_factory=dict)
    sampled: asyncio.Event = field(default_factory=asyncio.Event)

    def record_sampling(self, params: SamplingParams) -> None:
        """The service's `on_sampling` callback: keep the echoed values and wake a stream that
        waits for them."""
        self.sampling.update({name: float(getattr(params, name)) for name in ECHOED_SAMPLING})
        self.sampled.set()


def prepare(
    state: ServerState, req: ResponsesRequest, *, response_id: str | None = None
) -> Prepared:
    """Resolve `previous_response_id`, lower the conversation and build the GenerationRequest.
    Raises ApiError (404 response_not_found, 400 for history and template-option errors)."""
    rid = response_id or new_id("resp_")
    store = response_store(state)
    parent = (
        store.require(req.previous_response_id, "previous_response_id")
        if req.previous_response_id
        else None
    )
    history = parent.context if parent is not None else ()
    if not req.input_items and not (parent is not None and has_user_message(history)):
        # omitted or empty input only continues a chain that already holds a user query
        if not req.input_given:
            raise errors.missing("input")
        raise ApiError(
            400,
            "'input' is empty: it may be empty only when previous_response_id names a stored"
            " Response whose conversation already has a user message",
            code="missing_required_parameter",
            param="input",
        )
    items = (*history, *req.input_items)
    check_unique_ids(items, "input", offset=len(history))
    preserve = req.preserve_thinking
    kwargs = req.chat_template_kwargs or {}
    if preserve is None and kwargs.get("preserve_thinking") is None and parent is not None:
        preserve = parent.preserve_thinking  # children inherit the chain's resolved value
    cfg = state.config
    options = resolve_template_options(
        preserve_thinking=preserve,
        reasoning_effort=req.reasoning_effort,
        chat_template_kwargs=req.chat_template_kwargs,
        defaults=ThinkingDefaults.from_flags(cfg.thinking, cfg.preserve_thinking),
        fields={"reasoning_effort": "reasoning.effort"},
    )
    explicit = req.preserve_thinking
    if explicit is None:
        explicit = kwargs.get("preserve_thinking")
    # the chain's thinking history renders differently from the parent's (request_start flag)
    semantic_change = (
        parent is not None
        and explicit is not None
        and bool(options.preserve_thinking) != bool(parent.preserve_thinking)
    )
    lowered = items_to_messages(
        items,
        req.tools,
        instructions=req.instructions or None,  # "" adds no developer turn (as vLLM)
        history=len(history),
    )
    if not req.store:
        session = None  # store:false stays anonymous and never moves the chain's endpoint
    elif parent is not None and parent.session_key is not None:
        session = parent.session_key
    else:
        session = SESSION_PREFIX + rid
    generation = GenerationRequest(
        messages=lowered.messages,
        # Every declared function is rendered: allowed_tools restricts which calls become
        # function_call Items, never the prompt (as OpenAI keeps the tools list for caching).
        tools=req.tools.template_tools(),
        parse_tools=bool(req.callable_functions),
        callable_tools=None if req.allowed is None else req.tools.template_tools(req.allowed),
        template_options=options,
        sampling=SamplingOptions(temperature=req.temperature, top_p=req.top_p),
        max_tokens=req.max_output_tokens,
        cache_points=lowered.cache_points,
        implicit_cache_point=req.prompt_cache_mode == "implicit",
        session_key=session,
        protocol="responses",
        stream=req.stream,
        semantic_change=semantic_change,
        logprobs=req.logprobs,
        constraint=req.constraint,
    )
    return Prepared(rid, req, parent, generation, options, session)


# -----------------------------------------------------------------------------------------------
# The Response object
# -----------------------------------------------------------------------------------------------


def usage_dict(fin: Finished) -> dict[str, Any]:
    u = fin.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def response_object(
    p: Prepared,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    *,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    model: str,
) -> dict[str, Any]:
    """The wire Response. `completed_at` only for completed; incomplete carries
    incomplete_details.reason max_output_tokens. The sampling fields are the effective values
    (`Prepared.sampling`), which must have been recorded."""
    req = p.req
    if len(p.sampling) != len(ECHOED_SAMPLING):
        raise RuntimeError("a Response object was built before its sampler was resolved")
    return {
        "id": p.response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_retention": req.prompt_cache_retention,
        "reasoning": {"effort": req.reasoning_effort, "summary": req.reasoning_summary},
        "safety_identifier": req.safety_identifier,
        "service_tier": "default",
        "store": req.store,
        "temperature": p.sampling["temperature"],
        "presence_penalty": p.sampling["presence_penalty"],
        "frequency_penalty": p.sampling["frequency_penalty"],
        "text": {"format": req.text_format_wire or {"type": "text"}},
        "tool_choice": req.tool_choice_wire,
        "tools": list(req.tools.wire),
        "top_logprobs": req.logprobs or 0,
        "top_p": p.sampling["top_p"],
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
        "metadata": dict(req.metadata),
    }


def envelope_size(p: Prepared, model: str) -> int:
    """JSON size of `p`'s Response envelope with no output, for the store's check before
    generating. The sampler is not resolved yet, so its numbers are sized with the longest
    float text; the real envelope is never larger."""
    sized = dataclasses.replace(p, sampling=dict.fromkeys(ECHOED_SAMPLING, 1 / 3))
    return json_size(response_object(sized, 0, "completed", [], model=model))

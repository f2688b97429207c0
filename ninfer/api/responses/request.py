"""The top-level fields of a Responses create (and input-token count) request.

`parse_create_request(body, model_id=..., vision=...)` validates a decoded `POST /v1/responses`
body into a frozen `ResponsesRequest`; `parse_count_request` does the same for
`POST /v1/responses/input_tokens`, which accepts only the prompt-shaping fields. Both need no
engine and no store: resolving `previous_response_id` and rendering happen later
(`endpoints.py`). Contract: docs/serving.md, "OpenAI Responses", "Responses create
fields" and "Responses input token count".

- Unknown top-level fields fail with 400 `unknown_parameter`.
- Recognised features ninfer cannot provide (Conversations, prompt templates, context
  management, moderation, background execution, include values other than
  "reasoning.encrypted_content" and "message.output_text.logprobs", JSON output, forced tool choice, hosted tools, ...) fail with a field-specific 400 instead of being ignored.
- Advisory hints (metadata, client_metadata, user, safety_identifier, prompt-cache hints,
  service_tier auto/default, stream_options.include_obfuscation) are validated and have no
  effect on generation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.api.responses.items import parse_input
from ninfer.api.responses.reasoning_seal import ReasoningSeal
from ninfer.api.responses.tools import FunctionDef, ToolSet, parse_tool_choice, parse_tools
from ninfer.api.service.logprobs_fields import INCLUDE_LOGPROBS, responses_logprobs
from ninfer.api.service.output_constraints import combine, json_format, tool_constraint
from ninfer.api.service.template_options import REASONING_EFFORTS
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.api.wire.fields import (
    get_array,
    get_bool,
    get_enum,
    get_int,
    get_object,
    get_sampling,
    get_str,
)
from ninfer.constrain import ConstraintSpec
from ninfer.runtime.request import MAX_TOP_LOGPROBS

# Fields of the create body that ninfer reads (everything else is unknown_parameter or one of
# the recognised-unsupported features below).
CREATE_FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "max_output_tokens", "stream",
    "store", "temperature", "top_p", "metadata", "client_metadata", "reasoning",
    "chat_template_kwargs", "preserve_thinking", "text", "tools", "tool_choice",
    "parallel_tool_calls", "max_tool_calls", "truncation", "top_logprobs", "service_tier",
    "background", "include", "stream_options", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "safety_identifier", "user",
})  # fmt: skip
COUNT_FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "reasoning", "tools",
    "tool_choice", "parallel_tool_calls", "text", "truncation", "preserve_thinking",
    "chat_template_kwargs",
})  # fmt: skip
# Recognised Responses features with no local implementation: field -> what cannot be provided.
UNSUPPORTED_FEATURES = {
    "conversation": "Conversations (use previous_response_id)",
    "prompt": "stored prompt templates",
    "context_management": "server-side context management or compaction",
    "moderation": "content moderation",
    "access_programs": "domain-specific access programs",
    "background_options": "background execution",
    "image": "hosted image generation settings",
    "personality": "hosted personalities",
}
METADATA_MAX = 16
# `include` values ninfer honours: the reasoning token of each reasoning output Item
INCLUDE_REASONING = "reasoning.encrypted_content"


def unknown_parameter(name: str) -> ApiError:
    return ApiError(
        400,
        f"unknown parameter '{name}' for the Responses API",
        code="unknown_parameter",
        param=name,
    )


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request. `input_items` are canonical input Items with ids (see
    items.py); empty when `input` was omitted or empty. `input_given`: `input` was sent
    (not omitted or null). `allowed` is the allowed_tools subset or None. Sampling values and
    `max_output_tokens` are None when omitted. `include_reasoning`: include asked for
    "reasoning.encrypted_content" (each reasoning output Item carries a reasoning token).
    `logprobs`: top_logprobs or include "message.output_text.logprobs" asked for the
    output_text parts' log probabilities, with this many alternatives (logprobs_fields.py)."""

    model: str
    input_items: tuple[dict[str, Any], ...]
    input_given: bool
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    reasoning_effort: str | None = None
    reasoning_summary: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    preserve_thinking: bool | None = None
    tools: ToolSet = field(default_factory=ToolSet)
    tool_choice: Literal["auto", "none", "required"] = "auto"
    tool_choice_wire: Any = "auto"
    allowed: tuple[FunctionDef, ...] | None = None
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None
    prompt_cache_mode: Literal["implicit", "explicit"] = "implicit"
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    user: str | None = None
    include_reasoning: bool = False
    logprobs: int | None = None  # None, or alternatives per output_text token
    constraint: ConstraintSpec | None = None
    text_format_wire: Any = None  # text.format as sent (echoed), None: {"type": "text"}

    @property
    def callable_functions(self) -> tuple[FunctionDef, ...]:
        """Functions output may call: none under tool_choice none, else the allowed subset of
        the declared functions, in declaration order."""
        if self.tool_choice == "none":
            return ()
        return self.tools.functions if self.allowed is None else self.allowed


def parse_create_request(
    body: dict[str, Any], *, model_id: str, vision: bool, seal: ReasoningSeal | None = None
) -> ResponsesRequest:
    """Validate a `POST /v1/responses` body. Raises ApiError (404 model_not_found, else 400).
    `seal` opens reasoning `encrypted_content` tokens in the input (items.py)."""
    return _parse(body, CREATE_FIELDS, model_id=model_id, vision=vision, count=False, seal=seal)


def parse_count_request(
    body: dict[str, Any], *, model_id: str, vision: bool, seal: ReasoningSeal | None = None
) -> ResponsesRequest:
    """Validate a `POST /v1/responses/input_tokens` body (prompt-shaping fields only; `model`
    may be omitted and then means the served model)."""
    return _parse(body, COUNT_FIELDS, model_id=model_id, vision=vision, count=True, seal=seal)


def _parse(
    body: dict[str, Any],
    known: frozenset[str],
    *,
    model_id: str,
    vision: bool,
    count: bool,
    seal: ReasoningSeal | None,
) -> ResponsesRequest:
    for name, value in body.items():
        if name in UNSUPPORTED_FEATURES and value is not None:
            raise errors.unsupported_parameter(name, UNSUPPORTED_FEATURES[name])
        if name not in known and name not in UNSUPPORTED_FEATURES:
            raise unknown_parameter(name)
    # A count may omit the model (as OpenAI's input_tokens endpoint allows): the served one.
    model = get_str(body, "model", required=not count, nonempty=True) or model_id
    if model != model_id:
        raise errors.model_not_found(model, model_id)  # type: ignore[arg-type]
    _reject_unsupported(body)
    raw_input = body.get("input")
    items = (
        parse_input(raw_input, "input", vision=vision, seal=seal) if raw_input is not None else []
    )
    tools = parse_tools(body)
    tool_choice, allowed, single = parse_tool_choice(body, tools)
    reasoning = get_object(body, "reasoning")
    effort = summary = None
    if reasoning is not None:
        for key in reasoning:
            if key not in ("effort", "summary", "generate_summary"):
                raise unknown_parameter(f"reasoning.{key}")
        effort = get_enum(reasoning, "effort", REASONING_EFFORTS, "reasoning.effort")
        # "auto" asks for the best summary the model has: none here, and the reasoning Items
        # carry summary []; "concise" / "detailed" ask for one NInfer cannot write (docs/serving.md:
        # recognised but unsupported features are a field-specific 400)
        for key in ("summary", "generate_summary"):
            value = get_enum(reasoning, key, ("auto", "concise", "detailed"), f"reasoning.{key}")
            if value in ("concise", "detailed"):
                raise errors.unsupported_value(
                    f"reasoning.{key}", value, "reasoning summaries (no summarizer runs)"
                )
            summary = summary or value
    req = ResponsesRequest(
        model=model,  # type: ignore[arg-type]
        input_items=tuple(items),
        input_given=raw_input is not None,
        instructions=get_str(body, "instructions"),
        previous_response_id=get_str(body, "previous_response_id", nonempty=True),
        max_output_tokens=None if count else get_int(body, "max_output_tokens", lo=0),
        stream=False if count else bool(get_bool(body, "stream")),
        store=True if count else get_bool(body, "store") is not False,
        **({} if count else get_sampling(body, ("temperature", "top_p"))),
        metadata={} if count else _parse_metadata(body),
        reasoning_effort=effort,
        reasoning_summary=summary,
        chat_template_kwargs=get_object(body, "chat_template_kwargs"),
        preserve_thinking=get_bool(body, "preserve_thinking"),
        tools=tools,
        tool_choice=tool_choice,  # type: ignore[arg-type]
        tool_choice_wire=body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        allowed=allowed,
        parallel_tool_calls=get_bool(body, "parallel_tool_calls") is not False,
        max_tool_calls=None if count else get_int(body, "max_tool_calls", lo=0),
        prompt_cache_mode=_parse_prompt_cache(body),
        prompt_cache_key=get_str(body, "prompt_cache_key"),
        prompt_cache_retention=get_str(body, "prompt_cache_retention"),
        safety_identifier=get_str(body, "safety_identifier"),
        user=get_str(body, "user"),
        include_reasoning=INCLUDE_REASONING in (get_array(body, "include") or []),
        logprobs=None if count else responses_logprobs(body, get_array(body, "include") or []),
    )
    specs = [f.tool_spec() for f in req.callable_functions]
    text = get_object(body, "text")
    fmt = json_format(
        get_object(text, "format", "text.format") if text else None, "text.format", nested=False
    )
    tool_spec = tool_constraint(
        req.tool_choice, specs, parallel=req.parallel_tool_calls, single=single, answer=fmt
    )
    if not req.parallel_tool_calls and req.callable_functions and tool_spec is None:
        raise errors.unsupported_value(
            "parallel_tool_calls",
            False,
            "a limit of one tool call per response without tool_choice 'required' or strict"
            " tools (disable tools or omit it)",
        )
    constraint = combine(("text.format", fmt), tool_spec)
    wire_format = None if fmt is None else text["format"]  # type: ignore[index]
    return dataclasses.replace(req, constraint=constraint, text_format_wire=wire_format)


def _reject_unsupported(body: dict[str, Any]) -> None:
    """Supported fields whose non-neutral values ninfer cannot honour."""
    text = get_object(body, "text")
    if text is not None:
        verbosity = get_enum(text, "verbosity", ("low", "medium", "high"), "text.verbosity")
        if verbosity in ("low", "high"):
            raise errors.unsupported_value("text.verbosity", verbosity, "output verbosity control")
    truncation = get_enum(body, "truncation", ("auto", "disabled"))
    if truncation == "auto":
        raise errors.unsupported_value(
            "truncation", truncation, "silent truncation of the input (overlong input fails)"
        )
    get_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    tier = get_str(body, "service_tier")
    if tier not in (None, "auto", "default"):
        raise errors.unsupported_value("service_tier", tier, "service tiers other than default")
    if get_bool(body, "background"):
        raise errors.unsupported_value("background", True, "background execution")
    for i, value in enumerate(get_array(body, "include") or []):
        if not isinstance(value, str):
            raise errors.invalid_type(f"include[{i}]", "a string", value)
        if value not in (INCLUDE_REASONING, INCLUDE_LOGPROBS):
            raise errors.unsupported_value(
                f"include[{i}]",
                value,
                f"included output data other than {INCLUDE_REASONING} and {INCLUDE_LOGPROBS}",
            )
    opts = get_object(body, "stream_options")
    if opts is not None:
        for key in opts:
            if key != "include_obfuscation":
                raise unknown_parameter(f"stream_options.{key}")
        get_bool(opts, "include_obfuscation", "stream_options.include_obfuscation")
    cm = body.get("client_metadata")
    if cm is not None and not isinstance(cm, dict):
        raise errors.invalid_type("client_metadata", "an object", cm)
    for key in ("safety_identifier", "user", "prompt_cache_key"):
        get_str(body, key)
    get_enum(body, "prompt_cache_retention", ("in_memory", "24h"))


def _parse_metadata(body: dict[str, Any]) -> dict[str, str]:
    meta = get_object(body, "metadata")
    if meta is None:
        return {}
    if len(meta) > METADATA_MAX:
        raise errors.invalid_value(
            "metadata", f"at most {METADATA_MAX} pairs are allowed, got {len(meta)}"
        )
    for key, value in meta.items():
        if len(key) > 64:
            raise errors.invalid_value(f"metadata.{key[:20]}...", "keys are at most 64 characters")
        if not isinstance(value, str):
            raise errors.invalid_type(f"metadata.{key}", "a string", value)
        if len(value) > 512:
            raise errors.invalid_value(f"metadata.{key}", "values are at most 512 characters")
    return dict(meta)


def _parse_prompt_cache(body: dict[str, Any]) -> Literal["implicit", "explicit"]:
    opts = get_object(body, "prompt_cache_options")
    if opts is None:
        return "implicit"
    for key in opts:
        if key not in ("mode", "ttl", "prewarm", "comparison_response_id"):
            raise unknown_parameter(f"prompt_cache_options.{key}")
    get_enum(opts, "ttl", ("30m", "12h"), "prompt_cache_options.ttl")
    if get_bool(opts, "prewarm", "prompt_cache_options.prewarm"):
        raise errors.unsupported_value("prompt_cache_options.prewarm", True, "cache prewarming")
    get_str(opts, "comparison_response_id", "prompt_cache_options.comparison_response_id")
    mode = get_enum(opts, "mode", ("implicit", "explicit"), "prompt_cache_options.mode")
    return "explicit" if mode == "explicit" else "implicit"

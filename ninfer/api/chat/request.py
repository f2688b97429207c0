"""The OpenAI Chat Completions request: parsing, validation and the normalized form.

`parse_chat_request(body, model_id=..., vision=...)` turns a decoded JSON body into a frozen
`ChatRequest` or raises a field-specific `ApiError` (docs/serving.md, "OpenAI Chat
Completions"). It needs no engine, tokenizer or template: it decides only what the request
*says*. Later stages resolve it against the server:

- sampler fields are None when the request omits them (process flags and architecture presets
  fill them in); `max_tokens` None means --default-max-tokens; 0 means prompt only;
- `enable_thinking` / `preserve_thinking` / `reasoning_effort` are the typed top-level values
  and `chat_template_kwargs` is passed through as received: `template.resolve_template_options`
  merges them and reports conflicts (conflicting_template_option);
- messages keep their input order and text parts their bytes; tool schemas and historical
  tool-call arguments keep their JSON member order.

Output constraints (`response_format` JSON, llama.cpp's `json_schema` / `grammar`, vLLM's
`structured_outputs` / `guided_*`, a required or named `tool_choice`, strict tools) become one
`constraint` (ninfer.api.service.output_constraints), enforced by constrained decoding. Rejections: a
field whose requested behaviour ninfer cannot provide (audio, ...) fails with 400
`unsupported_parameter`
or `unsupported_value` naming the field; semantically neutral values of those fields pass;
unknown top-level fields are ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.api.chat.messages import (
    ChatMessage,
    ContentPart,
    MediaPart,
    Role,
    TextPart,
    ToolCall,
    parse_message,
)
from ninfer.api.service.generation import CachePoint
from ninfer.api.service.generation import (
    SamplingOptions as ChatSampling,  # sampler fields as requested
)
from ninfer.api.service.logprobs_fields import chat_choices, chat_logprobs
from ninfer.api.service.output_constraints import (
    combine,
    json_format,
    llama_fields,
    one_of,
    tool_constraint,
    vllm_fields,
)
from ninfer.api.service.prompt_cache import MAX_CACHE_WRITES
from ninfer.api.service.stops import validate_stops
from ninfer.api.service.template_options import REASONING_EFFORTS
from ninfer.api.service.tool_fields import (
    check_parameters_schema,
    check_tool_name,
    function_template_dict,
    read_strict,
    read_tool_choice,
)
from ninfer.api.wire import errors
from ninfer.api.wire.fields import (
    get_array,
    get_bool,
    get_enum,
    get_int,
    get_number,
    get_object,
    get_sampling,
    get_str,
    require_object,
)
from ninfer.constrain import ConstraintSpec, ToolSpec

__all__ = [
    "ChatMessage", "ChatRequest", "ChatSampling", "ContentPart", "FunctionTool", "MediaPart",
    "Role", "TextPart", "ToolCall", "parse_chat_request",
]  # fmt: skip

TOP_K_MAX = 20


@dataclass(frozen=True)
class FunctionTool:
    """A function tool; `parameters` keeps the client's member order; `strict`: its calls'
    arguments must be valid against `parameters`."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False

    def template_dict(self) -> dict[str, Any]:
        return function_template_dict(self.name, self.description, self.parameters)


@dataclass(frozen=True)
class ChatRequest:
    """A validated Chat Completions request (see the module docstring for what is resolved
    later). `allowed_tools` is None unless tool_choice was allowed_tools or a named function
    (then tool_choice is "required"). `constraint`: what the output must follow, if anything."""

    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: Literal["auto", "none", "required"] = "auto"
    allowed_tools: tuple[str, ...] | None = None
    constraint: ConstraintSpec | None = None
    sampling: ChatSampling = field(default_factory=ChatSampling)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    timings_per_token: bool = False
    return_progress: bool = False
    ignore_eos: bool = False  # vLLM-compatible extension: generate through EOS up to max_tokens
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    prompt_cache_mode: Literal["implicit", "explicit"] = "implicit"
    prompt_cache_key: str | None = None
    logprobs: int | None = None  # None, or alternatives per token (logprobs_fields.py)
    n: int = 1  # choices to generate

    @property
    def callable_tools(self) -> tuple[FunctionTool, ...]:
        """Tools the model's output may call: none under tool_choice "none", else the declared
        tools filtered by allowed_tools, in declaration order."""
        if self.tool_choice == "none":
            return ()
        if self.allowed_tools is None:
            return self.tools
        allowed = set(self.allowed_tools)
        return tuple(t for t in self.tools if t.name in allowed)

    @property
    def has_media(self) -> bool:
        return any(m.media for m in self.messages)

    @property
    def explicit_cache_points(self) -> tuple[CachePoint, ...]:
        """The end of every content part carrying an explicit prompt_cache_breakpoint, in input
        order; when more than four parts do, the latest four (one request writes at most four
        candidates)."""
        points: list[CachePoint] = []
        for i, m in enumerate(self.messages):
            offset = 0
            for p in m.parts:
                offset += len(p.text) if isinstance(p, TextPart) else 1
                if p.cache_breakpoint:
                    points.append(CachePoint(message=i, offset=offset))
        return tuple(points[-MAX_CACHE_WRITES:])

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.template_dict() for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.template_dict() for t in self.tools] or None


# -----------------------------------------------------------------------------------------------
# Entry point
# -----------------------------------------------------------------------------------------------


def parse_chat_request(body: dict[str, Any], *, model_id: str, vision: bool) -> ChatRequest:
    """Validate a decoded Chat Completions body against the server's public `model_id` and its
    --vision setting. Raises ApiError (404 model_not_found, 400 otherwise)."""
    model = get_str(body, "model", required=True, nonempty=True)
    if model != model_id:
        raise errors.model_not_found(model, model_id)
    _reject_unsupported(body)
    raw_messages = get_array(body, "messages", required=True)
    if not raw_messages:
        raise errors.invalid_value("messages", "must contain at least one message")
    messages = tuple(parse_message(m, f"messages[{i}]", vision) for i, m in enumerate(raw_messages))
    messages = _match_tool_results(messages)
    tools = _parse_tools(body)
    tool_choice, allowed, single = _parse_tool_choice(body, tools)
    req = ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        allowed_tools=allowed,
        sampling=_parse_sampling(body),
        max_tokens=_parse_max_tokens(body),
        stop=_parse_stop(body),
        stream=bool(get_bool(body, "stream")),
        include_usage=_parse_include_usage(body),
        timings_per_token=bool(get_bool(body, "timings_per_token")),
        return_progress=bool(get_bool(body, "return_progress")),
        ignore_eos=bool(get_bool(body, "ignore_eos")),
        reasoning_effort=get_enum(body, "reasoning_effort", REASONING_EFFORTS),
        enable_thinking=get_bool(body, "enable_thinking"),
        preserve_thinking=get_bool(body, "preserve_thinking"),
        chat_template_kwargs=get_object(body, "chat_template_kwargs"),
        prompt_cache_mode=_parse_prompt_cache(body),
        prompt_cache_key=get_str(body, "prompt_cache_key"),
        logprobs=chat_logprobs(body),
        n=chat_choices(body),
    )
    parallel = get_bool(body, "parallel_tool_calls") is not False
    index = {t.name: i for i, t in enumerate(tools)}
    specs = [
        ToolSpec(
            t.name, t.parameters or {}, t.strict, f"tools[{index[t.name]}].function.parameters"
        )
        for t in req.callable_tools
    ]
    fmt = json_format(get_object(body, "response_format"), "response_format", nested=True)
    llama, vllm = llama_fields(body), vllm_fields(body)
    answer = one_of([("response_format", fmt), *((s.path, s) for s in (llama, vllm) if s)])
    param = "response_format" if fmt is not None or answer is None else answer.path
    tool_spec = tool_constraint(
        req.tool_choice, specs, parallel=parallel, single=single, answer=answer
    )
    if not parallel and req.callable_tools and tool_spec is None:
        raise errors.unsupported_value(
            "parallel_tool_calls",
            False,
            "a limit of one tool call per response without tool_choice 'required' or strict"
            " tools (disable tools or omit it)",
        )
    return dataclasses.replace(req, constraint=combine((param, answer), tool_spec))


# -----------------------------------------------------------------------------------------------
# Tool-call history
# -----------------------------------------------------------------------------------------------


def _match_tool_results(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    """Check tool results against the assistant tool calls they answer, as OpenAI does, and put
    each group of results in call order (the Qwen prompt has no call ids: results are matched
    to calls by position).

    An assistant message whose calls all carry ids must be followed by exactly one role "tool"
    message per id; an unknown, duplicate or missing result fails with invalid_tool_history. A
    history that begins with results (a truncated or imported conversation) stays valid, as in
    Anthropic Messages. Legacy function history and calls without ids are not matched.
    """
    out: list[ChatMessage] = []
    i, n = 0, len(messages)
    only_instructions = True  # nothing but system/developer messages so far
    while i < n:
        m = messages[i]
        if m.role == "tool" and m.tool_call_id is not None and not only_instructions:
            raise errors.invalid_tool_history(
                f"messages[{i}]",
                f"tool message with tool_call_id {m.tool_call_id!r} must answer a tool call of "
                "the assistant message right before it",
            )
        out.append(m)
        i += 1
        if m.role not in ("system", "developer", "tool"):
            only_instructions = False
        ids = [c.id for c in m.tool_calls]
        if m.role != "assistant" or not ids:
            continue
        if None in ids:  # calls without ids: their results cannot be matched
            while i < n and messages[i].role == "tool":
                out.append(messages[i])
                i += 1
            continue
        first = i - 1
        for j, call_id in enumerate(ids):
            if call_id in ids[:j]:
                raise errors.invalid_tool_history(
                    f"messages[{first}].tool_calls[{j}].id",
                    f"tool call id {call_id!r} occurs twice in one assistant message",
                )
        results: dict[str, ChatMessage] = {}
        while i < n and messages[i].role == "tool" and messages[i].tool_call_id is not None:
            r = messages[i]
            if r.tool_call_id not in ids:
                raise errors.invalid_tool_history(
                    f"messages[{i}].tool_call_id",
                    f"tool_call_id {r.tool_call_id!r} does not answer a call of the assistant "
                    f"message messages[{first}] (its calls: {', '.join(map(repr, ids))})",
                )
            if r.tool_call_id in results:
                raise errors.invalid_tool_history(
                    f"messages[{i}].tool_call_id",
                    f"tool_call_id {r.tool_call_id!r} has more than one tool message",
                )
            results[r.tool_call_id] = r  # type: ignore[index]
            i += 1
        missing = [c for c in ids if c not in results]
        if missing and (results or i < n):
            raise errors.invalid_tool_history(
                f"messages[{first}].tool_calls",
                "an assistant message with tool_calls must be followed by one tool message per "
                f"call; no result for tool_call_id {', '.join(map(repr, missing))}",
            )
        out.extend(results[c] for c in ids if c in results)
    return tuple(out)


# -----------------------------------------------------------------------------------------------
# Capability rejections and neutral values
# -----------------------------------------------------------------------------------------------


def _reject_unsupported(body: dict[str, Any]) -> None:
    """Fields whose requested behaviour cannot be provided; their neutral values pass."""
    bias = get_object(body, "logit_bias")
    for token, value in (bias or {}).items():
        if not (token.isascii() and token.isdigit()):
            raise errors.invalid_value(
                f"logit_bias.{token}", "keys must be token ids (integers written as strings)"
            )
        v = get_number(bias, token, f"logit_bias.{token}", lo=-100, hi=100)
        if v:
            raise errors.unsupported_value(
                f"logit_bias.{token}", value, "logit bias (only all-zero biases are accepted)"
            )
    for i, m in enumerate(get_array(body, "modalities") or []):
        if m == "audio":
            raise errors.unsupported_value(f"modalities[{i}]", m, "audio output")
        if m != "text":
            raise errors.invalid_value(f"modalities[{i}]", f"must be 'text', got {m!r}")
    get_object(body, "audio")  # output-audio settings are neutral while modalities is text-only
    if body.get("web_search_options") is not None:
        raise errors.unsupported_parameter("web_search_options", "web search")
    if body.get("moderation") not in (None, False):
        raise errors.unsupported_parameter("moderation", "content moderation")
    if get_enum(body, "verbosity", ("low", "medium", "high")) in ("low", "high"):
        raise errors.unsupported_value("verbosity", body["verbosity"], "output verbosity control")
    if get_bool(body, "store"):
        raise errors.unsupported_value("store", True, "stored Chat Completions")
    if get_array(body, "functions"):
        raise errors.unsupported_parameter(
            "functions", "legacy function declarations; declare them in 'tools'"
        )
    fc = body.get("function_call")
    if fc is not None and fc not in ("none", "auto"):
        if isinstance(fc, dict):
            raise errors.unsupported_value("function_call", fc, "a forced function call")
        raise errors.invalid_value("function_call", f"must be 'none' or 'auto', got {fc!r}")
    rep = get_number(body, "repetition_penalty", lo=0)
    if rep is not None and rep != 1.0:
        raise errors.unsupported_value(
            "repetition_penalty",
            body["repetition_penalty"],
            "a repetition penalty (only 1 is accepted)",
        )
    mm = get_object(body, "mm_processor_kwargs")
    for key, value in (mm or {}).items():
        if value is not None:
            raise errors.unsupported_parameter(
                f"mm_processor_kwargs.{key}", "per-request media processor settings"
            )
    # Advisory fields: accepted when well-typed, no effect on execution.
    get_object(body, "metadata")
    get_object(body, "prediction")
    for key in ("user", "safety_identifier", "service_tier"):
        get_str(body, key)
    get_enum(body, "prompt_cache_retention", ("in_memory", "24h"))  # as Responses checks it


# -----------------------------------------------------------------------------------------------
# Tools
# -----------------------------------------------------------------------------------------------


def _parse_tools(body: dict[str, Any]) -> tuple[FunctionTool, ...]:
    tools: list[FunctionTool] = []
    seen: set[str] = set()
    for i, raw in enumerate(get_array(body, "tools") or []):
        param = f"tools[{i}]"
        tool = require_object(raw, param)
        kind = get_str(tool, "type", f"{param}.type", required=True)
        if kind != "function":
            raise errors.unsupported_value(
                f"{param}.type", kind, "tools other than client-executed functions"
            )
        fn = get_object(tool, "function", f"{param}.function", required=True)
        fparam = f"{param}.function"
        strict = read_strict(fn, fparam)  # type: ignore[arg-type]
        name = get_str(fn, "name", f"{fparam}.name", required=True, nonempty=True)
        check_tool_name(name, f"{fparam}.name")  # type: ignore[arg-type]
        if name in seen:
            raise errors.invalid_value(f"{fparam}.name", f"tool {name!r} is declared twice")
        seen.add(name)  # type: ignore[arg-type]
        parameters = get_object(fn, "parameters", f"{fparam}.parameters")
        check_parameters_schema(parameters, f"{fparam}.parameters")
        tools.append(
            FunctionTool(
                name,  # type: ignore[arg-type]
                get_str(fn, "description", f"{fparam}.description"),
                parameters,
                strict,
            )
        )
    return tuple(tools)


def _parse_tool_choice(
    body: dict[str, Any], tools: tuple[FunctionTool, ...]
) -> tuple[Literal["auto", "none", "required"], tuple[str, ...] | None, bool]:
    """(mode, allowed tool names or None, whether exactly one call is forced). A named function
    is mode "required" over that one tool; allowed_tools keeps its mode."""
    kind, obj = read_tool_choice(body)
    declared = {t.name for t in tools}
    if obj is None:
        if kind == "required" and not tools:
            raise errors.invalid_value("tool_choice", "'required' needs at least one tool")
        return kind, None, False  # type: ignore[return-value]
    if kind == "function":
        fn = get_object(obj, "function", "tool_choice.function", required=True)
        name = get_str(fn, "name", "tool_choice.function.name", required=True)
        if name not in declared:
            raise errors.invalid_value(
                "tool_choice.function.name", f"tool {name!r} is not declared in 'tools'"
            )
        return "required", (name,), True  # type: ignore[return-value]
    if kind != "allowed_tools":
        raise errors.invalid_value(
            "tool_choice.type", f"must be 'function' or 'allowed_tools', got {kind!r}"
        )
    spec = get_object(obj, "allowed_tools", "tool_choice.allowed_tools", required=True)
    mode = get_str(spec, "mode", "tool_choice.allowed_tools.mode", required=True)
    if mode not in ("auto", "required"):
        raise errors.invalid_value(
            "tool_choice.allowed_tools.mode", f"must be 'auto' or 'required', got {mode!r}"
        )
    names: list[str] = []
    for i, raw in enumerate(
        get_array(spec, "tools", "tool_choice.allowed_tools.tools", required=True)
    ):  # type: ignore[arg-type]
        param = f"tool_choice.allowed_tools.tools[{i}]"
        ref = require_object(raw, param)
        if get_str(ref, "type", f"{param}.type") not in (None, "function"):
            raise errors.unsupported_value(
                f"{param}.type", ref.get("type"), "tools other than client-executed functions"
            )
        fn = ref.get("function")
        target = (
            fn if isinstance(fn, dict) else ref
        )  # {"type":"function","function":{"name"}} or {"type","name"}
        name = get_str(
            target,
            "name",
            f"{param}.function.name" if target is fn else f"{param}.name",
            required=True,
        )
        if name not in declared:
            raise errors.invalid_value(
                f"{param}", f"allowed tool {name!r} is not declared in 'tools'"
            )
        names.append(name)  # type: ignore[arg-type]
    if mode == "required" and not names:
        raise errors.invalid_value("tool_choice.allowed_tools.tools", "'required' needs a tool")
    return mode, tuple(names), False  # type: ignore[return-value]


# -----------------------------------------------------------------------------------------------
# Sampling and output controls
# -----------------------------------------------------------------------------------------------


def _parse_sampling(body: dict[str, Any]) -> ChatSampling:
    return ChatSampling(**get_sampling(body, top_k=(0, TOP_K_MAX)))


def _parse_max_tokens(body: dict[str, Any]) -> int | None:
    """max_completion_tokens wins over the legacy max_tokens spelling; both nonnegative."""
    new = get_int(body, "max_completion_tokens", lo=0)
    old = get_int(body, "max_tokens", lo=0)
    return new if new is not None else old


def _parse_stop(body: dict[str, Any]) -> tuple[str, ...]:
    """Up to four non-empty stop strings (a lone string is one; duplicates dropped)."""
    return validate_stops(body.get("stop"), "stop")


def _parse_include_usage(body: dict[str, Any]) -> bool:
    opts = get_object(body, "stream_options")
    if opts is None:
        return False
    return bool(get_bool(opts, "include_usage", "stream_options.include_usage"))


def _parse_prompt_cache(body: dict[str, Any]) -> Literal["implicit", "explicit"]:
    opts = get_object(body, "prompt_cache_options")
    if opts is None:
        return "implicit"
    mode = get_enum(opts, "mode", ("implicit", "explicit"), "prompt_cache_options.mode")
    return "explicit" if mode == "explicit" else "implicit"

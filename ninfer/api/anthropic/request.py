"""The Anthropic Messages request: validation and lowering to a `GenerationRequest`.

`parse_messages_request(body, vision=..., default_max_tokens=..., thinking_defaults=...)` turns a
decoded /v1/messages (or, with `count_only=True`, /v1/messages/count_tokens) body into a frozen
`MessagesRequest` or raises a field-specific `ApiError` (docs/serving.md, "Anthropic Messages").
`MessagesRequest.generation_request()` is what `ModelService.generate` / `count_prompt_tokens` take.

- `model` is any non-empty label, echoed back; it does not select the artifact.
- `max_tokens` is optional (default --default-max-tokens); 0 is refused (no zero-output
  prewarm lifecycle). `temperature`, `top_p`, `top_k` and `stop_sequences` reach the engine.
- `thinking`: disabled -> enable_thinking false; adaptive -> true; enabled -> true with
  `budget_tokens` (>= 1024 and < max_tokens) as the request's thinking budget;
  `display: "omitted"` is refused. `output_config.effort` becomes the template's
  reasoning_effort, with thinking disabled too (in Anthropic's API effort is not a thinking
  switch); `preserve_thinking` and `chat_template_kwargs` are ninfer extensions.
- `context_management` (server-side context editing) is refused, except the no-op edit
  `clear_thinking_20251015` with `keep: "all"` that Claude Code sends.
- tools: user-defined, with an object `input_schema` (-> OpenAI-style function tools;
  `input_examples` kept as a member of the function). `strict` tools, `tool_choice` any / tool
  and Structured Outputs (`output_config.format`, or the beta `output_format`) are enforced by
  constrained decoding (ninfer.api.service.output_constraints); `disable_parallel_tool_use` with
  callable tools needs one of those. Server tools, toolsets, MCP, deferred tools and tools not
  callable directly are refused naming the capability.
- cache_control: at most four block-level breakpoints; a request-level `cache_control`
  targets the last cacheable block (merge at the same TTL, conflict at another, needs a free
  slot otherwise). Each breakpoint becomes a `CachePoint` at the end of its block (a tool's
  definition, a text/image block, a tool_use, a whole tool_result).
- Output-only fields (sampling, stop, stream, max_tokens) are ignored by count_tokens.
Advisory fields (metadata, service_tier, inference_geo, ...) and unknown fields are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.api.anthropic.content import Conversation, lower_conversation, parse_cache_control
from ninfer.api.service.generation import CachePoint, GenerationRequest, SamplingOptions
from ninfer.api.service.output_constraints import (
    anthropic_format,
    combine,
    conflict,
    tool_constraint,
)
from ninfer.api.service.stops import validate_stops
from ninfer.api.service.template_options import (
    TemplateOptions,
    ThinkingDefaults,
    resolve_template_options,
)
from ninfer.api.service.tool_fields import (
    check_tool_name,
    function_template_dict,
    read_strict,
    reject_defer_loading,
)
from ninfer.api.wire import errors
from ninfer.api.wire.fields import (
    get_array,
    get_bool,
    get_enum,
    get_int,
    get_object,
    get_sampling,
    get_str,
    require_object,
)
from ninfer.constrain import ConstraintSpec, ToolSpec

MIN_THINKING_BUDGET = 1024
MAX_BREAKPOINTS = 4
EFFORTS = ("low", "medium", "high", "xhigh", "max")

ThinkingMode = Literal["disabled", "adaptive", "enabled"]


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages request. `max_tokens` is resolved (the server default applied);
    `messages` / `tools` are template-form; `thinking` is None when the request left it to
    the server and template defaults."""

    model: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Literal["auto", "none", "required"] = "auto"
    forced_tool: str | None = None  # tool_choice {"type": "tool", "name"}
    constraint: ConstraintSpec | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    max_tokens: int = 8192
    max_tokens_given: bool = True  # False: the server default (logged as not requested)
    stop: tuple[str, ...] = ()
    stream: bool = False
    thinking: ThinkingMode | None = None
    thinking_budget: int | None = None
    template_options: TemplateOptions = field(default_factory=TemplateOptions)
    prefill: bool = False
    cache_points: tuple[CachePoint, ...] = ()
    has_media: bool = False

    def generation_request(self) -> GenerationRequest:
        return GenerationRequest(
            messages=[dict(m) for m in self.messages],
            tools=[dict(t) for t in self.tools] or None,
            parse_tools=bool(self.tools) and self.tool_choice != "none",
            callable_tools=[t for t in self.tools if t["function"]["name"] == self.forced_tool]
            if self.forced_tool
            else None,
            template_options=self.template_options,
            sampling=self.sampling,
            max_tokens=self.max_tokens if self.max_tokens_given else None,
            stop=self.stop,
            continue_final_message=self.prefill,
            thinking_budget=self.thinking_budget,
            cache_points=self.cache_points,
            protocol="anthropic",
            stream=self.stream,
            constraint=self.constraint,
        )


def parse_messages_request(
    body: dict[str, Any],
    *,
    vision: bool,
    default_max_tokens: int,
    thinking_defaults: ThinkingDefaults | None = None,
    count_only: bool = False,
) -> MessagesRequest:
    """Validate a decoded Messages (or count_tokens) body. Raises ApiError (400)."""
    model = get_str(body, "model", required=True, nonempty=True)
    _reject_unsupported(body)
    tools, tool_marks, strict = _parse_tools(body)
    tool_choice, forced, parallel = _parse_tool_choice(body, tools)
    conv = lower_conversation(
        body.get("system"), body.get("messages"), vision=vision, first_serial=len(tools)
    )
    max_tokens = default_max_tokens if count_only else _parse_max_tokens(body, default_max_tokens)
    thinking, budget = _parse_thinking(body, None if count_only else max_tokens)
    if conv.prefill and thinking in ("enabled", "adaptive"):
        raise errors.unsupported_value(
            "thinking.type", thinking, "an assistant prefill that starts with thinking enabled"
        )
    options = resolve_template_options(
        enable_thinking=None if thinking is None else thinking != "disabled",
        preserve_thinking=get_bool(body, "preserve_thinking"),
        reasoning_effort=_parse_effort(body),
        chat_template_kwargs=get_object(body, "chat_template_kwargs"),
        defaults=thinking_defaults or ThinkingDefaults(),
        fields={"enable_thinking": "thinking.type", "reasoning_effort": "output_config.effort"},
        effort_enables_thinking=False,
    )
    cache_points = _cache_points(body, conv, tool_marks)
    specs = [
        ToolSpec(name, t["function"]["parameters"], name in strict, f"tools[{i}].input_schema")
        for i, t in enumerate(tools)
        if (name := t["function"]["name"]) == forced or forced is None
    ]
    fmt = anthropic_format(body)
    tool_spec = tool_constraint(
        tool_choice, specs, parallel=parallel, single=forced is not None, answer=fmt
    )
    if not parallel and tools and tool_choice == "auto" and tool_spec is None:
        raise errors.unsupported_value(
            "tool_choice.disable_parallel_tool_use",
            True,
            "a limit of one tool call per response without tool_choice any / tool or strict tools",
        )
    where = fmt.path.removesuffix(".schema") if fmt is not None else "output_config.format"
    constraint = combine((where, fmt), tool_spec)
    if constraint is not None and conv.prefill:
        raise conflict(
            "messages", "an assistant prefill cannot be combined with a constrained output"
        )
    return MessagesRequest(
        model=model,  # type: ignore[arg-type]
        messages=tuple(conv.messages),
        tools=tuple(tools),
        tool_choice=tool_choice,
        forced_tool=forced,
        constraint=constraint,
        sampling=SamplingOptions() if count_only else _parse_sampling(body),
        max_tokens=max_tokens,
        max_tokens_given=body.get("max_tokens") is not None,
        stop=() if count_only else _parse_stop(body),
        stream=False if count_only else bool(get_bool(body, "stream")),
        thinking=thinking,
        thinking_budget=budget,
        template_options=options,
        prefill=conv.prefill,
        cache_points=cache_points,
        has_media=conv.has_media,
    )


# -----------------------------------------------------------------------------------------------
# Capability rejections
# -----------------------------------------------------------------------------------------------


def _reject_unsupported(body: dict[str, Any]) -> None:
    if get_array(body, "mcp_servers"):
        raise errors.unsupported_parameter("mcp_servers", "MCP servers (no MCP connector)")
    if body.get("container") is not None:
        raise errors.unsupported_parameter("container", "code-execution containers")
    _check_context_management(get_object(body, "context_management"))
    # Advisory: accepted when well-typed, no effect on execution.
    get_object(body, "metadata")
    for key in ("service_tier", "inference_geo", "speed"):
        get_str(body, key)


# -----------------------------------------------------------------------------------------------
# Tools
# -----------------------------------------------------------------------------------------------


def _parse_tools(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]], set[str]]:
    """OpenAI-style function tools, their cache markers [(serial, ttl, param)] (a tool's serial
    is its index: tools come first in the cacheable order) and the names of strict tools."""
    strict: set[str] = set()
    tools: list[dict[str, Any]] = []
    marks: list[tuple[int, str, str]] = []
    seen: set[str] = set()
    for i, raw in enumerate(get_array(body, "tools") or []):
        param = f"tools[{i}]"
        tool = require_object(raw, param)
        kind = get_str(tool, "type", f"{param}.type")
        if kind not in (None, "custom"):
            what = (
                "toolsets" if "toolset" in kind else "Anthropic-provided server tools (no executor)"
            )
            if kind.startswith("mcp"):
                what = "MCP toolsets"
            raise errors.unsupported_value(f"{param}.type", kind, what)
        is_strict = read_strict(tool, param)
        reject_defer_loading(tool, param)
        callers = get_array(tool, "allowed_callers", f"{param}.allowed_callers")
        if callers is not None and "direct" not in callers:
            raise errors.unsupported_value(
                f"{param}.allowed_callers", callers, "tools that the model may not call directly"
            )
        name = get_str(tool, "name", f"{param}.name", required=True, nonempty=True)
        check_tool_name(name, f"{param}.name")  # type: ignore[arg-type]
        if name in seen:
            raise errors.invalid_value(f"{param}.name", f"tool {name!r} is declared twice")
        seen.add(name)  # type: ignore[arg-type]
        if is_strict:
            strict.add(name)  # type: ignore[arg-type]
        schema = get_object(tool, "input_schema", f"{param}.input_schema", required=True)
        if schema.get("type") != "object":  # type: ignore[union-attr]
            raise errors.invalid_value(f"{param}.input_schema.type", "must be 'object'")
        description = get_str(tool, "description", f"{param}.description")
        declared = function_template_dict(name, description, schema)  # type: ignore[arg-type]
        examples = get_array(tool, "input_examples", f"{param}.input_examples")
        if examples:
            for j, ex in enumerate(examples):
                require_object(ex, f"{param}.input_examples[{j}]")
            declared["function"]["input_examples"] = examples
        get_bool(tool, "eager_input_streaming", f"{param}.eager_input_streaming")
        ttl = parse_cache_control(tool, param)
        if ttl is not None:
            marks.append((i, ttl, param))
        tools.append(declared)
    return tools, marks, strict


def _parse_tool_choice(
    body: dict[str, Any], tools: list[dict[str, Any]]
) -> tuple[Literal["auto", "none", "required"], str | None, bool]:
    """(mode, the named tool or None, parallel calls allowed): `any` is "required" over every
    tool, `tool` over the one it names."""
    choice = get_object(body, "tool_choice")
    if choice is None:
        return "auto", None, True
    kind = get_str(choice, "type", "tool_choice.type", required=True)
    if kind not in ("auto", "none", "any", "tool"):
        raise errors.invalid_value(
            "tool_choice.type", f"must be 'auto', 'none', 'any' or 'tool', got {kind!r}"
        )
    single = get_bool(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use")
    if kind in ("any", "tool") and not tools:
        raise errors.invalid_value("tool_choice.type", f"{kind!r} needs at least one tool")
    name = None
    if kind == "tool":
        name = get_str(choice, "name", "tool_choice.name", required=True, nonempty=True)
        if name not in {t["function"]["name"] for t in tools}:
            raise errors.invalid_value("tool_choice.name", f"tool {name!r} is not declared")
    mode = "required" if kind in ("any", "tool") else kind
    return mode, name, not single  # type: ignore[return-value]


# -----------------------------------------------------------------------------------------------
# Output, sampling and thinking
# -----------------------------------------------------------------------------------------------


def _parse_max_tokens(body: dict[str, Any], default: int) -> int:
    value = get_int(body, "max_tokens", lo=0)
    if value == 0:
        raise errors.unsupported_value("max_tokens", 0, "a zero-output cache-prewarm request")
    return default if value is None else value


def _parse_sampling(body: dict[str, Any]) -> SamplingOptions:
    names = ("temperature", "top_p", "top_k")
    # top_k as Chat takes it: 0..20 (the sampler keeps at most 20 candidates; ninfer.api.service.sampling)
    return SamplingOptions(**get_sampling(body, names, temperature=(0.0, 1.0), top_k=(0, 20)))


def _parse_stop(body: dict[str, Any]) -> tuple[str, ...]:
    """stop_sequences: any number (the Messages API sets no limit; Chat's stop keeps four)."""
    return validate_stops(get_array(body, "stop_sequences"), "stop_sequences", most=None)


def _parse_thinking(
    body: dict[str, Any], max_tokens: int | None
) -> tuple[ThinkingMode | None, int | None]:
    """(mode, budget); `max_tokens` None skips the budget < max_tokens check (count_tokens)."""
    cfg = get_object(body, "thinking")
    if cfg is None:
        return None, None
    kind = get_str(cfg, "type", "thinking.type", required=True)
    if kind not in ("disabled", "adaptive", "enabled"):
        if kind == "between_tools":
            raise errors.unsupported_value(
                "thinking.type", kind, "thinking only between tool calls"
            )
        raise errors.invalid_value(
            "thinking.type", f"must be 'disabled', 'adaptive' or 'enabled', got {kind!r}"
        )
    display = get_str(cfg, "display", "thinking.display")
    if display == "omitted":
        raise errors.unsupported_value(
            "thinking.display",
            display,
            "encrypted hidden-reasoning restore (omitted thinking display)",
        )
    if display not in (None, "summarized"):
        raise errors.invalid_value(
            "thinking.display", f"must be 'summarized' or 'omitted', got {display!r}"
        )
    if kind == "adaptive" and cfg.get("budget_tokens") is not None:  # as Anthropic's API
        raise errors.invalid_value(
            "thinking.budget_tokens", "is not permitted with thinking type 'adaptive'"
        )
    if kind != "enabled":
        return kind, None  # type: ignore[return-value]
    budget = get_int(cfg, "budget_tokens", "thinking.budget_tokens", required=True)
    if budget < MIN_THINKING_BUDGET:  # type: ignore[operator]
        raise errors.invalid_value(
            "thinking.budget_tokens", f"must be >= {MIN_THINKING_BUDGET}, got {budget}"
        )
    if max_tokens is not None and budget >= max_tokens:  # type: ignore[operator]
        raise errors.invalid_value(
            "thinking.budget_tokens", f"must be less than max_tokens ({max_tokens}), got {budget}"
        )
    return "enabled", budget


def _check_context_management(cfg: dict[str, Any] | None) -> None:
    """Server-side context editing is refused, except the edit that changes nothing: Claude Code
    sends `clear_thinking_20251015` with `keep: "all"` (keep every thinking block)."""
    if cfg is None:
        return
    for i, raw in enumerate(get_array(cfg, "edits", "context_management.edits") or []):
        param = f"context_management.edits[{i}]"
        edit = require_object(raw, param)
        kind = get_str(edit, "type", f"{param}.type", required=True)
        if kind != "clear_thinking_20251015":
            raise errors.unsupported_value(f"{param}.type", kind, "server-side context editing")
        if edit.get("keep") != "all":
            raise errors.unsupported_value(
                f"{param}.keep",
                edit.get("keep"),
                'server-side context editing; only keep "all", which edits nothing, is accepted',
            )


def _parse_effort(body: dict[str, Any]) -> str | None:
    cfg = get_object(body, "output_config")
    if cfg is None:
        return None
    return get_enum(cfg, "effort", EFFORTS, "output_config.effort")


# -----------------------------------------------------------------------------------------------
# Cache breakpoints
# -----------------------------------------------------------------------------------------------


def _cache_points(
    body: dict[str, Any], conv: Conversation, tool_marks: list[tuple[int, str, str]]
) -> tuple[CachePoint, ...]:
    """Validate block-level and request-level cache_control; return where each marked block
    ends, in wire order (tools, system, messages)."""
    # target serial -> (ttl, point); a tool's serial is its index
    targets: dict[int, tuple[str, CachePoint | None]] = {
        s: (ttl, CachePoint(tool=s)) for s, ttl, _ in tool_marks
    }
    for bp in conv.breakpoints:
        targets[bp.serial] = (bp.ttl, bp.point)
    if len(targets) > MAX_BREAKPOINTS:
        raise errors.invalid_value(
            "cache_control",
            f"at most {MAX_BREAKPOINTS} blocks may carry cache_control, got {len(targets)}",
        )
    ttl = parse_cache_control(body, "")
    if ttl is not None:
        last = conv.last_cacheable
        if last is None:
            raise errors.invalid_value(
                "cache_control", "the request has no cacheable block to mark"
            )
        serial, point, param = last
        if serial in targets:
            if targets[serial][0] != ttl:
                raise errors.invalid_value(
                    "cache_control",
                    f"ttl {ttl!r} conflicts with the ttl {targets[serial][0]!r} of {param}.cache_control",
                )
        elif len(targets) >= MAX_BREAKPOINTS:
            raise errors.invalid_value(
                "cache_control",
                f"{MAX_BREAKPOINTS} blocks already carry cache_control; no slot is left for the "
                "request-level breakpoint",
            )
        else:
            targets[serial] = (ttl, point)
    return tuple(p for _, (_, p) in sorted(targets.items()) if p is not None)

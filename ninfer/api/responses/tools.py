"""Responses function tools: direct definitions, namespace groups and their engine identities.

Responses declares functions flat (``{"type": "function", "name", "description",
"parameters", "strict"}``) or grouped in a namespace (``{"type": "namespace", "name",
"description", "tools": [functions]}``). The Qwen prompt and the tool-call parser know one flat
function name per tool, so every (namespace, name) pair gets a distinct *internal* name:

    direct "get_weather"                  -> "get_weather"
    namespace "mcp__weather", "get_current" -> "mcp__weather__get_current"
    (a collision with another internal name appends "_2", "_3", ...)

`ToolSet.public(internal)` restores the separate namespace and name for output Items and SSE
events; `ToolSet.internal(namespace, name)` renders historical calls, including calls to
functions that the current request no longer declares.

`strict: true` is enforced by constrained decoding (ninfer.api.service.output_constraints), and so is a
required or named `tool_choice`. Rejections (400, naming the field): hosted/MCP/custom tools,
defer_loading, output schemas, caller restrictions that exclude direct invocation, and duplicate
names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.api.service.tool_fields import (
    TOOL_NAME,
    check_parameters_schema,
    check_tool_name,
    function_template_dict,
    read_strict,
    read_tool_choice,
    reject_defer_loading,
)
from ninfer.api.wire import errors
from ninfer.api.wire.fields import get_array, get_bool, get_object, get_str, require_object
from ninfer.constrain import ToolSpec

NS_SEPARATOR = "__"
HOSTED = "hosted, MCP or custom tools (ninfer executes no tools; declare client functions)"


@dataclass(frozen=True)
class FunctionDef:
    """One declared client function. `internal` is its engine identity (see module docstring);
    `parameters` keeps the client's member order; `strict`: calls must have valid arguments;
    `param`: where it is declared (e.g. `tools[0]`)."""

    name: str
    namespace: str | None
    internal: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False
    param: str = ""

    def tool_spec(self) -> ToolSpec:
        """The constraint engine's view of this function (under its internal name)."""
        return ToolSpec(
            self.internal, self.parameters or {}, self.strict, f"{self.param}.parameters"
        )

    def template_dict(self) -> dict[str, Any]:
        """The OpenAI-style definition the chat template renders (under the internal name)."""
        return function_template_dict(self.internal, self.description, self.parameters)


@dataclass(frozen=True)
class ToolSet:
    """The declared functions in declaration order, plus the echo of the wire `tools` array."""

    functions: tuple[FunctionDef, ...] = ()
    wire: tuple[dict[str, Any], ...] = ()

    def find(self, namespace: str | None, name: str) -> FunctionDef | None:
        for f in self.functions:
            if f.namespace == namespace and f.name == name:
                return f
        return None

    def internal(self, namespace: str | None, name: str) -> str:
        """The engine name of (namespace, name); undeclared pairs get the default spelling."""
        f = self.find(namespace, name)
        if f is not None:
            return f.internal
        return name if namespace is None else f"{namespace}{NS_SEPARATOR}{name}"

    def public(self, internal: str) -> tuple[str | None, str]:
        """(namespace, name) of an internal name; an unknown name is a direct function."""
        for f in self.functions:
            if f.internal == internal:
                return f.namespace, f.name
        return None, internal

    def template_tools(
        self, only: tuple[FunctionDef, ...] | None = None
    ) -> list[dict[str, Any]] | None:
        chosen = self.functions if only is None else only
        return [f.template_dict() for f in chosen] or None


def parse_tools(body: dict[str, Any]) -> ToolSet:
    """Validate `tools` (see module docstring). Raises ApiError 400."""
    raw_tools = get_array(body, "tools") or []
    pending: list[tuple[str | None, str, str | None, dict[str, Any] | None, bool, str]] = []
    wire: list[dict[str, Any]] = []
    seen: set[tuple[str | None, str]] = set()
    for i, raw in enumerate(raw_tools):
        param = f"tools[{i}]"
        tool = require_object(raw, param)
        kind = get_str(tool, "type", f"{param}.type", required=True)
        if kind == "function":
            name, desc, params, strict = _parse_function(tool, param)
            members = [(None, name, desc, params, strict, param)]
        elif kind == "namespace":
            ns = get_str(tool, "name", f"{param}.name", required=True, nonempty=True)
            check_tool_name(ns, f"{param}.name")  # type: ignore[arg-type]
            get_str(tool, "description", f"{param}.description")
            members = []
            inner = get_array(tool, "tools", f"{param}.tools", required=True)
            for j, fraw in enumerate(inner or []):
                fparam = f"{param}.tools[{j}]"
                fn = require_object(fraw, fparam)
                fkind = get_str(fn, "type", f"{fparam}.type", required=True)
                if fkind == "namespace":  # malformed, not a hosted tool: say so
                    raise errors.invalid_value(
                        f"{fparam}.type", "namespaces do not nest; a namespace groups functions"
                    )
                if fkind != "function":
                    raise errors.unsupported_value(f"{fparam}.type", fkind, HOSTED)
                name, desc, params, strict = _parse_function(fn, fparam)
                members.append((ns, name, desc, params, strict, fparam))
        else:
            raise errors.unsupported_value(f"{param}.type", kind, HOSTED)
        for ns, name, desc, params, strict, fparam in members:
            if (ns, name) in seen:
                where = f" in namespace {ns!r}" if ns else ""
                raise errors.invalid_value(
                    f"{fparam}.name", f"function {name!r}{where} is declared twice"
                )
            seen.add((ns, name))
            pending.append((ns, name, desc, params, strict, fparam))
        wire.append(tool)
    # Direct names keep their spelling; namespaced pairs avoid every name already taken.
    taken = {name for ns, name, *_ in pending if ns is None}
    functions: list[FunctionDef] = []
    for ns, name, desc, params, strict, fparam in pending:
        if ns is None:
            internal = name
        else:
            base = f"{ns}{NS_SEPARATOR}{name}"
            internal, k = base, 2
            while internal in taken:
                internal, k = f"{base}_{k}", k + 1
            taken.add(internal)
            if not TOOL_NAME.fullmatch(internal):  # the engine identity must stay callable
                raise errors.invalid_value(
                    f"{fparam}.name",
                    f"namespace {ns!r} and function {name!r} together exceed 128 characters",
                )
        functions.append(FunctionDef(name, ns, internal, desc, params, strict, fparam))
    return ToolSet(tuple(functions), tuple(wire))


def _parse_function(
    fn: dict[str, Any], param: str
) -> tuple[str, str | None, dict[str, Any] | None, bool]:
    name = get_str(fn, "name", f"{param}.name", required=True, nonempty=True)
    check_tool_name(name, f"{param}.name")  # type: ignore[arg-type]
    desc = get_str(fn, "description", f"{param}.description")
    params = get_object(fn, "parameters", f"{param}.parameters")
    check_parameters_schema(params, f"{param}.parameters")
    strict = read_strict(fn, param)
    reject_defer_loading(fn, param)
    if fn.get("output_schema") is not None:
        raise errors.unsupported_parameter(f"{param}.output_schema", "tool output schemas")
    callers = get_array(fn, "allowed_callers", f"{param}.allowed_callers")
    if callers is not None and "direct" not in callers:
        raise errors.unsupported_value(
            f"{param}.allowed_callers", callers, "programmatic-only tool invocation"
        )
    if get_bool(fn, "async", f"{param}.async"):
        raise errors.unsupported_value(f"{param}.async", True, "asynchronous tool execution")
    return name, desc, params, strict  # type: ignore[return-value]


def parse_tool_choice(
    body: dict[str, Any], tools: ToolSet
) -> tuple[str, tuple[FunctionDef, ...] | None, bool]:
    """("auto" | "none" | "required", allowed subset or None, exactly one call forced).
    allowed_tools filters the declared functions without changing declaration order; a named
    function ({"type": "function", "name", "namespace"?}) is "required" over that one."""
    kind, obj = read_tool_choice(body)
    if obj is None:
        if kind == "required" and not tools.functions:
            raise errors.invalid_value("tool_choice", "'required' needs at least one tool")
        return kind, None, False
    if kind == "function":
        name = get_str(obj, "name", "tool_choice.name", required=True, nonempty=True)
        ns = get_str(obj, "namespace", "tool_choice.namespace")
        found = tools.find(ns, name)  # type: ignore[arg-type]
        if found is None:
            raise errors.invalid_value(
                "tool_choice.name", f"function {name!r} is not declared in 'tools'"
            )
        return "required", (found,), True
    if kind != "allowed_tools":
        raise errors.unsupported_value("tool_choice.type", kind, HOSTED)
    mode = get_str(obj, "mode", "tool_choice.mode", required=True)
    if mode not in ("auto", "required"):
        raise errors.invalid_value(
            "tool_choice.mode", f"must be 'auto' or 'required', got {mode!r}"
        )
    wanted: set[tuple[str | None, str]] = set()
    for i, raw in enumerate(get_array(obj, "tools", "tool_choice.tools", required=True) or []):
        param = f"tool_choice.tools[{i}]"
        ref = require_object(raw, param)
        rkind = get_str(ref, "type", f"{param}.type", required=True)
        if rkind != "function":
            raise errors.unsupported_value(f"{param}.type", rkind, HOSTED)
        name = get_str(ref, "name", f"{param}.name", required=True, nonempty=True)
        ns = get_str(ref, "namespace", f"{param}.namespace")
        if tools.find(ns, name) is None:  # type: ignore[arg-type]
            where = f" in namespace {ns!r}" if ns else ""
            raise errors.invalid_value(
                param, f"allowed tool {name!r}{where} is not declared in 'tools'"
            )
        wanted.add((ns, name))  # type: ignore[arg-type]
    if mode == "required" and not wanted:
        raise errors.invalid_value("tool_choice.tools", "'required' needs at least one tool")
    return mode, tuple(f for f in tools.functions if (f.namespace, f.name) in wanted), False

"""Pieces of function-tool declarations shared by every protocol's tool parsing.

Chat Completions (`tools[i].function`), Responses (`tools[i]`, namespace members) and Anthropic
Messages (`tools[i]`) each declare client functions in their own wire shape; all of them lower
a function to the one OpenAI-style definition the chat template renders, read `strict` the same
way (enforced by constrained decoding, ninfer.api.service.output_constraints) and refuse the flags
that need tool search.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ninfer.api.wire import errors
from ninfer.api.wire.fields import get_bool, get_str, require_object


def function_template_dict(
    name: str, description: str | None, parameters: dict[str, Any] | None
) -> dict[str, Any]:
    """The OpenAI-style definition the chat template renders: {"type": "function", "function":
    {"name", "description"?, "parameters"?}}; None members are left out."""
    fn: dict[str, Any] = {"name": name}
    if description is not None:
        fn["description"] = description
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


# A function name the Qwen wire format (`<function=NAME>`) can carry and the output parser
# (ninfer.api.service.toolcalls) accepts as a call; a declared name outside it could never be called.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def check_tool_name(name: str, param: str) -> str:
    """`name` when it is a callable function name, else 400 invalid_value naming `param`."""
    if not TOOL_NAME.fullmatch(name):
        raise errors.invalid_value(
            param,
            f"tool name {name[:80]!r} must be 1 to 128 letters, digits, '_', '-', '.' or ':'",
        )
    return name


def check_parameters_schema(schema: Mapping[str, Any] | None, param: str) -> None:
    """A function's parameters schema describes the arguments object: when it states a
    top-level `type`, that type must be "object" (400 invalid_value on `param`.type)."""
    if schema is not None and "type" in schema and schema["type"] != "object":
        raise errors.invalid_value(
            f"{param}.type",
            f"the parameters schema must have type 'object', got {schema['type']!r}",
        )


def read_strict(fn: Mapping[str, Any], param: str) -> bool:
    """`strict` (a boolean, default false): the tool's call arguments must be valid against its
    schema, which constrained decoding enforces."""
    return bool(get_bool(fn, "strict", f"{param}.strict"))


def reject_defer_loading(fn: Mapping[str, Any], param: str) -> None:
    """`defer_loading: true` needs tool search: 400 unsupported_value."""
    if get_bool(fn, "defer_loading", f"{param}.defer_loading"):
        raise errors.unsupported_value(
            f"{param}.defer_loading", True, "deferred tool loading (no tool search)"
        )


def read_tool_choice(body: Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None]:
    """The part of `tool_choice` every OpenAI protocol reads the same way: ("auto", None),
    ("none", None) or ("required", None) for those strings (absent means auto), else (type,
    object) for an object choice (a named "function", "allowed_tools", ...: the protocol reads
    it). A forced custom (free-form) tool is refused; other strings are invalid."""
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        return "auto", None
    if choice in ("none", "required"):
        return choice, None
    if isinstance(choice, str):
        raise errors.invalid_value(
            "tool_choice",
            f"must be 'auto', 'none', 'required' or a tool choice object, got {choice!r}",
        )
    obj = require_object(choice, "tool_choice")
    kind = get_str(obj, "type", "tool_choice.type", required=True)
    if kind == "custom":
        raise errors.unsupported_value(
            "tool_choice", obj, "a forced custom tool call (declare client functions)"
        )
    return kind, obj  # type: ignore[return-value]

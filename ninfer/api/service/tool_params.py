"""Typed conversion of tool-call parameters by the tool's JSON schema.

`tool_parameter_types` reads the declared tools (Chat Completions, Responses or Anthropic
definitions) into name -> {parameter -> admitted JSON types}; `convert_parameter` turns one
parameter's raw text, as the model wrote it between `<parameter=P>` and `</parameter>`
(ninfer.api.service.toolcalls), into a JSON value of an admitted type, or reports it omitted or
mismatched (`Converted`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})


def parameter_types(schema: Any) -> frozenset[str] | None:
    """Types admitted by one parameter schema, or None when it has no supported explicit type.

    Supported: a direct `type` (a JSON type name or a list of them), or an `anyOf`/`oneOf` whose
    every branch has such a direct type.
    """
    if not isinstance(schema, Mapping):
        return None

    def direct(s: Any) -> frozenset[str] | None:
        t = s.get("type") if isinstance(s, Mapping) else None
        if isinstance(t, str):
            return frozenset({t}) if t in JSON_TYPES else None
        if isinstance(t, list) and t and all(isinstance(x, str) and x in JSON_TYPES for x in t):
            return frozenset(t)
        return None

    if "type" in schema:
        return direct(schema)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            types: set[str] = set()
            for b in branches:
                bt = direct(b)
                if bt is None:
                    return None
                types |= bt
            return frozenset(types)
    return None


def tool_parameter_types(
    tools: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, frozenset[str] | None]]:
    """Declared tools: name -> {parameter -> admitted types}. Accepts Chat Completions
    (`{"type": "function", "function": {...}}`), Responses (`{"type": "function", "name": ...}`)
    and Anthropic (`{"name": ..., "input_schema": ...}`) definitions."""
    out: dict[str, dict[str, frozenset[str] | None]] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = fn.get("name")
        if not isinstance(name, str):
            continue
        schema = fn.get("parameters", fn.get("input_schema"))
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        params = {}
        if isinstance(props, Mapping):
            params = {str(k): parameter_types(v) for k, v in props.items()}
        out[name] = params
    return out


class _Invalid:
    pass


_INVALID = _Invalid()


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError:
        return _INVALID


def _admits(types: frozenset[str], value: Any) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return "integer" in types or "number" in types
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    if isinstance(value, str):
        return "string" in types
    if value is None:
        return "null" in types
    if isinstance(value, dict):
        return "object" in types
    return "array" in types  # list


@dataclass(frozen=True)
class Converted:
    """One converted parameter: omitted (empty non-string block), or a value, possibly one that
    does not match its schema (kept so the tool consumer can report it)."""

    omitted: bool = False
    value: Any = None
    mismatch: bool = False


def convert_parameter(text: str, types: frozenset[str] | None) -> Converted:
    """Typed conversion of a parameter's text (formatting newlines already removed).

    - untyped (None): JSON text keeps its JSON type, anything else is a string;
    - "string" admitted: the text as is (also when empty or JSON-looking);
    - empty (whitespace-only) text: omitted;
    - "boolean" admitted: true/false in any letter case;
    - JSON text keeps its JSON type (a mismatch if the schema does not admit that type);
    - other text becomes a string (a mismatch).
    """
    if types is None:
        v = _parse_json(text) if text.strip() else _INVALID
        return Converted(value=text if v is _INVALID else v)
    if "string" in types:
        return Converted(value=text)
    s = text.strip()
    if not s:
        return Converted(omitted=True)
    if "boolean" in types and s.lower() in ("true", "false"):
        return Converted(value=s.lower() == "true")
    v = _parse_json(s)
    if v is _INVALID:
        return Converted(value=text, mismatch=True)
    return Converted(value=v, mismatch=not _admits(types, v))

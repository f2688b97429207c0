"""What a request asks to be constrained to, independent of the grammar engine.

Each spec carries `path`: where in the request it came from, so that a `ConstraintError` can
name the exact field (the schema path is appended to it). The API builds these from
`response_format`, `text.format`, llama.cpp's `json_schema` / `grammar`, and `tools` with
`tool_choice`; `compile_constraint` (ninfer.constrain.compile) turns one into a `Constraint`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class JsonObject:
    """Any JSON object (Chat `response_format: {"type": "json_object"}`)."""

    path: str = "response_format"


@dataclass(frozen=True)
class JsonSchema:
    """A JSON value valid against `schema`. `strict` (the client's flag): a keyword the engine
    cannot enforce is refused with a ConstraintError; not strict: it is ignored (best effort),
    as OpenAI does for non-strict schemas."""

    schema: Mapping[str, Any] | bool
    strict: bool = True
    path: str = "response_format.json_schema.schema"


@dataclass(frozen=True)
class Grammar:
    """A context-free grammar: `syntax` "gbnf" (llama.cpp's `grammar` field) or "lark"
    (llguidance's Lark dialect)."""

    text: str
    syntax: Literal["gbnf", "lark"] = "gbnf"
    path: str = "grammar"


@dataclass(frozen=True)
class Regex:
    """Text matching a regular expression (whole output, Rust `regex` syntax)."""

    pattern: str
    path: str = "regex"


@dataclass(frozen=True)
class ToolSpec:
    """One declared function tool: its name, its parameters JSON schema, and whether its calls
    must be valid (`strict`; forced calls always are). `path` names the schema in the request,
    e.g. `tools[0].function.parameters`."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    strict: bool = True
    path: str = "tools[0].function.parameters"


@dataclass(frozen=True)
class ForcedToolCall:
    """The output is one or more Qwen XML tool calls and nothing else (`tool_choice`
    "required": every declared tool; a named function: only that one). `parallel` False allows
    exactly one call. `call_format` "json": Hermes JSON calls instead (the chat template's form,
    ninfer.constrain.tools_json)."""

    tools: tuple[ToolSpec, ...]
    parallel: bool = True
    call_format: Literal["xml", "json"] = "xml"


@dataclass(frozen=True)
class StrictTools:
    """Free text, optionally followed by Qwen XML tool calls (`tool_choice` auto with
    `strict: true` tools): a call to a strict tool has arguments valid against its schema; a call
    to a non-strict tool names one of its declared parameters with free text values.
    `answer` (a JSON response format sent with the tools): the output is either that JSON
    answer or calls, never free text. `call_format` as in ForcedToolCall."""

    tools: tuple[ToolSpec, ...]
    parallel: bool = True
    answer: JsonObject | JsonSchema | None = None
    call_format: Literal["xml", "json"] = "xml"


ConstraintSpec = JsonObject | JsonSchema | Grammar | Regex | ForcedToolCall | StrictTools

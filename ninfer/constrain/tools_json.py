"""Lark rules for Hermes JSON tool calls, the format ninfer.api.service.toolcalls_json parses:

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

`json_call_rules` gives the `call` / `call_body` rules that ninfer.constrain.tools' grammars
(forced calls, strict tools) use for the Qwen XML form, so free text, leading newlines and
parallel calls work the same in both formats. Each tool's call object is one `%json` schema: a
`name` const, then `arguments` valid against the tool's parameters (a strict or forced tool) or
any object (a non-strict tool), members in that order and nothing else. A strict tool's
`$defs` / `definitions` move to the call object's root, where its `#/$defs/...` refs resolve.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ninfer.constrain.errors import ConstraintError
from ninfer.constrain.schema import JSON_OPTIONS
from ninfer.constrain.spec import ToolSpec

_DEFS = ("$defs", "definitions")


def call_schema(tool: ToolSpec) -> dict[str, Any]:
    """The JSON schema of one call object to `tool` (without the layout options)."""
    params = tool.parameters if isinstance(tool.parameters, Mapping) else {}
    if tool.strict:
        arguments = {k: v for k, v in params.items() if k not in _DEFS}
        arguments.setdefault("type", "object")
        # only declared members, as the XML grammar allows only declared parameters
        arguments.setdefault("additionalProperties", False)
    else:
        arguments = {"type": "object"}
    schema: dict[str, Any] = {k: params[k] for k in _DEFS if tool.strict and k in params}
    schema.update(
        type="object",
        properties={"name": {"const": tool.name}, "arguments": arguments},
        required=["name", "arguments"],
        additionalProperties=False,
    )
    return schema


def json_call_rules(tools: tuple[ToolSpec, ...], open_marker: str, close_marker: str) -> list[str]:
    """`call: OPEN call_body` and `call_body: "\\n" (one call object) "\\n" CLOSE`, with the
    markers as ninfer.constrain.tools spells them (a single added token or quoted text)."""
    if not tools:
        raise ConstraintError("tools", "no tool to call")
    rules = [
        f"call: {open_marker} call_body",
        f'call_body: "\\n" ({" | ".join(f"fn_{i}" for i in range(len(tools)))}) "\\n" '
        + close_marker,
    ]
    for i, tool in enumerate(tools):
        schema = {**call_schema(tool), "x-guidance": JSON_OPTIONS}
        rules.append(f"fn_{i}: %json {json.dumps(schema)}")
    return rules

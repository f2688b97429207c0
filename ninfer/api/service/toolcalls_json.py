"""Incremental parser for Hermes JSON tool calls in the answer (content) stream.

Wire format written by the model (Qwen2.5, Hermes and many other templates tell it so, and render
assistant history the same way):

    <tool_call>
    {"name": NAME, "arguments": {...}}
    </tool_call>

`JsonToolCallParser` keeps the contract of the Qwen XML parser (ninfer.api.service.toolcalls;
docs/serving.md, "Tool calls"): the same events, `ToolParseStats` and results whatever the
chunking. Text before the first `<tool_call>` streams at once; from there to the end of the
output is the tool-call region, held until `finish`, then one `ToolCallStart`, one
`ToolCallArgumentsDelta` (the whole arguments object) and `ToolCallEnd` per call. Calls are
separated by whitespace, and whitespace around the JSON object is formatting.

The object must have a string `name` naming a callable tool and an `arguments` object (a JSON
string holding an object is accepted too, as some models write it; no `arguments` is `{}`);
other members are ignored. The arguments are re-serialised compactly (no spaces, as OpenAI
sends them), members in generated order. Fallback returns the whole region to content without
losing a byte, and everything after it is content too: invalid JSON, a duplicate member,
NaN / Infinity, or an output ending inside a call is `malformed_structure`; an unknown name
`undeclared_tool` (`invalid_tool_name` when it is not a valid name); text after the last call
`trailing_content`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from ninfer.api.service.tool_fields import TOOL_NAME
from ninfer.api.service.toolcalls import (
    _S,
    _WS,
    TOOL_CLOSE,
    TOOL_OPEN,
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallParser,
    ToolCallStart,
    ToolEvent,
    _Fallback,
)

# The base class's structural states, as this format uses them: between calls (CALL_OPEN: the
# base's finish() accepts the region only there), inside the JSON object, before </tool_call>.
_BETWEEN = _S.CALL_OPEN
_BODY = _S.FUNC_OPEN
_CLOSING = _S.AFTER_FUNC


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # json would keep the last silently: the call is ambiguous
        raise _Fallback("malformed_structure")
    return obj


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: would re-serialise as Infinity, not JSON
        raise _Fallback("malformed_structure")
    return value


def _constant(text: str) -> Any:
    raise _Fallback("malformed_structure")  # NaN, Infinity, -Infinity are not JSON


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_float=_finite, parse_constant=_constant)


class JsonToolCallParser(ToolCallParser):
    """Streaming Hermes JSON tool-call parser for one response (see module docstring).

    Args:
        tools: the effective declared tools (OpenAI/Responses/Anthropic definitions).
        make_id: returns the id of each new call (default `call_<hex>`).
    """

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]],
        make_id: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(tools, make_id)
        self._state = _BETWEEN
        self._probe = 0  # where to look for the next </tool_call> that may end the object
        self._parsed: list[tuple[str, str]] = []  # (name, compact arguments JSON)

    def _scan(self, final: bool) -> None:
        """Advance over `_region` as far as the text decides; raise _Fallback at the first
        problem. A JSON object is only decoded once a `</tool_call>` follows its start (or at
        the end of output), so a long call costs one decode per closer, not one per chunk."""
        r = self._region
        while True:
            i = _WS.match(r, self._pos).end()
            if i == len(r):
                return
            if self._state is not _BODY:
                marker = TOOL_OPEN if self._state is _BETWEEN else TOOL_CLOSE
                if r.startswith(marker, i):
                    self._pos = i + len(marker)
                    if self._state is _BETWEEN:
                        self._state, self._probe = _BODY, self._pos
                    else:
                        self._state = _BETWEEN
                    continue
                if not final and marker.startswith(r[i : i + len(marker)]):
                    return  # the marker is still arriving
                raise _Fallback(
                    "trailing_content" if self._state is _BETWEEN else "malformed_structure"
                )
            if r[i] != "{":
                raise _Fallback("malformed_structure")
            if not final:
                j = r.find(TOOL_CLOSE, self._probe)
                if j < 0:
                    self._probe = max(self._probe, len(r) - len(TOOL_CLOSE) + 1)
                    return
                self._probe = j + 1
            try:
                obj, end = _DECODER.raw_decode(r, i)
            except json.JSONDecodeError:
                if final:
                    raise _Fallback("malformed_structure") from None
                continue  # that </tool_call> was inside a string: wait for the next one
            self._parsed.append(self._call(obj))
            self._raw.append(self._parsed[-1])  # the base's finish() checks there is a call
            self._pos, self._state = end, _CLOSING

    def _call(self, obj: dict[str, Any]) -> tuple[str, str]:
        name = obj.get("name")
        if not isinstance(name, str):
            raise _Fallback("malformed_structure")
        if name not in self.tools:
            raise _Fallback("undeclared_tool" if TOOL_NAME.fullmatch(name) else "invalid_tool_name")
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = _DECODER.decode(args)
            except json.JSONDecodeError:
                raise _Fallback("malformed_structure") from None
        if not isinstance(args, dict):
            raise _Fallback("malformed_structure")
        return name, json.dumps(args, ensure_ascii=False, separators=(",", ":"))

    def _emit_calls(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        for index, (name, arguments) in enumerate(self._parsed):
            call = ToolCall(self._make_id(), name, arguments)
            self.calls.append(call)
            events += [
                ToolCallStart(index, call.id, name),
                ToolCallArgumentsDelta(index, arguments),
                ToolCallEnd(index, call),
            ]
        self.stats.calls = len(self.calls)
        self._region = ""
        return events


ToolCallFormat = Literal["xml", "json"]


def template_tool_format(source: str, declares_tools: bool) -> ToolCallFormat:
    """The call format a chat template teaches its model, from its Jinja source (read once, at
    load): "json" (Hermes) when it writes `"name"` / `"arguments"` JSON inside `<tool_call>`
    and no Qwen XML `<function=` markup; otherwise "xml", also for a template that does not
    read `tools` (ninfer then writes the tools in its own Qwen XML text: tool_fallback.py)."""
    text = source.replace('\\"', '"')  # quotes escaped inside Jinja string literals
    if not declares_tools or "<function=" in text or TOOL_OPEN not in text:
        return "xml"
    return "json" if '"name"' in text and '"arguments"' in text else "xml"


def tool_call_parser(
    fmt: ToolCallFormat,
    tools: Sequence[Mapping[str, Any]],
    make_id: Callable[[], str] | None = None,
) -> ToolCallParser:
    """The streaming parser of the `fmt` calls (both have ToolCallParser's interface)."""
    return (JsonToolCallParser if fmt == "json" else ToolCallParser)(tools, make_id)


def parse_calls(
    text: str,
    tools: Sequence[Mapping[str, Any]],
    fmt: ToolCallFormat = "json",
    make_id: Callable[[], str] | None = None,
) -> ParsedOutput:
    """Parse a complete answer text at once (same rules as streaming)."""
    p = tool_call_parser(fmt, tools, make_id)
    events = p.feed(text) + p.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return ParsedOutput(content, tuple(p.calls), p.stats)

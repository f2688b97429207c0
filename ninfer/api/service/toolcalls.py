"""Incremental parser for Qwen XML tool calls in the answer (content) stream.

Wire format written by the model (and by `templates/qwen_xml.jinja` for history):

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

Contract of `ToolCallParser` (docs/serving.md, "Tool calls"; docs/request-log.md, tool_call_parse):

- Text before the first `<tool_call>` is content and streams at once; only a suffix that may be
  the start of `<tool_call>` is held back.
- From the first `<tool_call>` to the end of the output is the *tool-call region*: one or more
  calls separated by whitespace. It is held until the output ends (`finish`), because anything
  after the last call (`trailing_content`) turns the whole region back into text. Then each call
  is emitted as `ToolCallStart`, one `ToolCallArgumentsDelta` per argument member (the deltas
  concatenate to the final arguments JSON, members in parameter order) and `ToolCallEnd`.
- Fallback: a malformed structure (including an unmatched nested `<parameter=` or a standalone
  `</parameter>`, or an output that ends inside a call), an invalid or undeclared tool name, a
  duplicate parameter or trailing content returns the complete region to content without losing
  a byte; everything after it is content too. `stats.fallback_reason` says why.
- A parameter value runs to the `</parameter>` that balances its `<parameter=`: balanced nested
  parameter markup and `</function>`, `<tool_call>`, `</tool_call>` inside a value are value text.
  One newline after the opener and one before the closer are formatting and dropped.
- Values are typed by the tool's JSON schema (`convert_parameter`, ninfer.api.service.tool_params).
- Results do not depend on how the stream is chunked.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from ninfer.api.service.tool_fields import TOOL_NAME
from ninfer.api.service.tool_params import convert_parameter, tool_parameter_types

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"

_MAX_NAME = 256  # a name longer than this without its ">" is malformed
_WS = re.compile(r"\s*")


# ---------------------------------------------------------------------------------------------
# Events and results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A structured call: `arguments` is JSON object text, members in generated order."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    call: ToolCall


ToolEvent = ContentDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd


@dataclass
class ToolParseStats:
    """Diagnostics for the request log (`request_done.result.tool_call_parse`); no text."""

    marker_seen: bool = False
    calls: int = 0
    empty_omitted: int = 0
    schema_mismatches: int = 0
    fallback_reason: str = "none"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def unparsed_stats(content: str) -> ToolParseStats:
    """The diagnostics of an output no parser read (no callable tool was declared, or
    tool_choice none): a complete marker in it stayed text, its tool not callable."""
    start = content.find(TOOL_OPEN)
    seen = start >= 0 and content.find(TOOL_CLOSE, start + len(TOOL_OPEN)) >= 0
    return ToolParseStats(marker_seen=seen, fallback_reason="undeclared_tool" if seen else "none")


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


class _Mode(Enum):
    CONTENT = "content"
    REGION = "region"
    PASSTHROUGH = "passthrough"  # after a fallback everything is text


class _S(Enum):  # structural states inside the region
    CALL_OPEN = 0  # expecting <tool_call> (or end of output after at least one call)
    FUNC_OPEN = 1
    FUNC_NAME = 2
    PARAMS = 3
    PARAM_NAME = 4
    VALUE = 5
    AFTER_FUNC = 6


@dataclass
class _RawCall:
    name: str
    params: list[tuple[str, str]] = field(default_factory=list)  # (name, raw value text)


class _Fallback(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _partial_prefix_len(buf: str, marker: str) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


class ToolCallParser:
    """Streaming Qwen XML tool-call parser for one response (see module docstring).

    Args:
        tools: the effective declared tools (OpenAI/Responses/Anthropic definitions).
        make_id: returns the id of each new call (default `call_<hex>`).
    """

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]],
        make_id: Callable[[], str] | None = None,
    ) -> None:
        self.tools = tool_parameter_types(tools)
        self._make_id = make_id or _new_call_id
        self.stats = ToolParseStats()
        self.calls: list[ToolCall] = []
        self._mode = _Mode.CONTENT
        self._hold = ""  # CONTENT: possible start of <tool_call>
        self._region = ""  # REGION: text from the first <tool_call>
        self._state = _S.CALL_OPEN
        self._pos = 0
        self._raw: list[_RawCall] = []
        self._cur: _RawCall | None = None
        self._value_start = 0
        self._depth = 0
        self._done = False

    # -- public API ----------------------------------------------------------------------------

    def feed(self, text: str) -> list[ToolEvent]:
        """Consume content text; returns the events that became certain."""
        if self._done:
            raise RuntimeError("feed after finish")
        if not text:
            return []
        if self._mode is _Mode.PASSTHROUGH:
            return [ContentDelta(text)]
        if self._mode is _Mode.REGION:
            self._region += text
            return self._advance(final=False)
        buf = self._hold + text
        i = buf.find(TOOL_OPEN)
        if i < 0:
            keep = _partial_prefix_len(buf, TOOL_OPEN)
            self._hold = buf[len(buf) - keep :]
            out = buf[: len(buf) - keep]
            return [ContentDelta(out)] if out else []
        self._hold = ""
        self.stats.marker_seen = True
        self._mode = _Mode.REGION
        self._region = buf[i:]
        events: list[ToolEvent] = [ContentDelta(buf[:i])] if i else []
        return events + self._advance(final=False)

    def finish(self) -> list[ToolEvent]:
        """End of output: emit the calls, or return the region to content."""
        if self._done:
            return []
        self._done = True
        if self._mode is _Mode.CONTENT:
            out, self._hold = self._hold, ""
            return [ContentDelta(out)] if out else []
        if self._mode is _Mode.PASSTHROUGH:
            return []
        events = self._advance(final=True)
        if self._mode is _Mode.PASSTHROUGH:
            return events
        if self._state is not _S.CALL_OPEN or not self._raw:
            return self._fall_back("malformed_structure")
        return self._emit_calls()

    @property
    def content_held(self) -> str:
        """Text currently held back (ambiguous marker prefix or the tool-call region)."""
        return self._hold if self._mode is _Mode.CONTENT else self._region

    # -- internals -----------------------------------------------------------------------------

    def _fall_back(self, reason: str) -> list[ToolEvent]:
        self.stats.fallback_reason = reason
        self._mode = _Mode.PASSTHROUGH
        text, self._region = self._region, ""
        return [ContentDelta(text)] if text else []

    def _advance(self, final: bool) -> list[ToolEvent]:
        try:
            self._scan(final)
        except _Fallback as f:
            return self._fall_back(f.reason)
        return []

    def _scan(self, final: bool) -> None:
        """Advance the structural scan over `_region` as far as the text allows."""
        r = self._region
        while True:
            st = self._state
            if st in (_S.CALL_OPEN, _S.FUNC_OPEN, _S.PARAMS, _S.AFTER_FUNC):
                i = _WS.match(r, self._pos).end()
                rest = r[i:]
                if not rest:
                    return
                expected = {
                    _S.CALL_OPEN: (TOOL_OPEN,),
                    _S.FUNC_OPEN: (FUNC_OPEN,),
                    _S.PARAMS: (PARAM_OPEN, FUNC_CLOSE),
                    _S.AFTER_FUNC: (TOOL_CLOSE,),
                }[st]
                hit = next((m for m in expected if rest.startswith(m)), None)
                if hit is None:
                    if not final and any(m.startswith(rest) for m in expected):
                        return  # a marker still arriving
                    raise _Fallback(
                        "trailing_content" if st is _S.CALL_OPEN else "malformed_structure"
                    )
                self._pos = i + len(hit)
                if hit == TOOL_OPEN:
                    self._state = _S.FUNC_OPEN
                elif hit == FUNC_OPEN:
                    self._state = _S.FUNC_NAME
                elif hit == PARAM_OPEN:
                    self._state = _S.PARAM_NAME
                elif hit == FUNC_CLOSE:
                    self._state = _S.AFTER_FUNC
                else:  # TOOL_CLOSE
                    assert self._cur is not None
                    self._raw.append(self._cur)
                    self._cur = None
                    self._state = _S.CALL_OPEN
            elif st in (_S.FUNC_NAME, _S.PARAM_NAME):
                j = r.find(">", self._pos)
                seg = r[self._pos : j if j >= 0 else len(r)]
                if "\n" in seg or len(seg) > _MAX_NAME:
                    raise _Fallback("malformed_structure")
                if j < 0:
                    return
                self._pos = j + 1
                if st is _S.FUNC_NAME:
                    if seg not in self.tools:
                        raise _Fallback(
                            "undeclared_tool" if TOOL_NAME.fullmatch(seg) else "invalid_tool_name"
                        )
                    self._cur = _RawCall(seg)
                    self._state = _S.PARAMS
                else:
                    assert self._cur is not None
                    if not seg:
                        raise _Fallback("malformed_structure")
                    if any(seg == name for name, _ in self._cur.params):
                        raise _Fallback("duplicate_parameter")
                    self._cur.params.append((seg, ""))
                    self._value_start = self._pos
                    self._depth = 0
                    self._state = _S.VALUE
            else:  # VALUE: find the </parameter> that balances the opener
                assert self._cur is not None
                while True:
                    a = r.find(PARAM_OPEN, self._pos)
                    b = r.find(PARAM_CLOSE, self._pos)
                    if b < 0:
                        if a >= 0:
                            self._depth += 1
                            self._pos = a + len(PARAM_OPEN)
                            continue
                        # Resume where a marker may still be arriving.
                        self._pos = max(self._pos, len(r) - len(PARAM_CLOSE) + 1)
                        return
                    if 0 <= a < b:
                        self._depth += 1
                        self._pos = a + len(PARAM_OPEN)
                        continue
                    self._pos = b + len(PARAM_CLOSE)
                    if self._depth == 0:
                        value = r[self._value_start : b]
                        value = value.removeprefix("\n")
                        value = value.removesuffix("\n")
                        name = self._cur.params[-1][0]
                        self._cur.params[-1] = (name, value)
                        self._state = _S.PARAMS
                        break
                    self._depth -= 1

    def _emit_calls(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        for index, raw in enumerate(self._raw):
            types = self.tools[raw.name]
            members: list[str] = []
            for name, text in raw.params:
                conv = convert_parameter(text, types.get(name))
                if conv.omitted:
                    self.stats.empty_omitted += 1
                    continue
                if conv.mismatch:
                    self.stats.schema_mismatches += 1
                key = json.dumps(name, ensure_ascii=False)
                members.append(f"{key}: {json.dumps(conv.value, ensure_ascii=False)}")
            call_id = self._make_id()
            events.append(ToolCallStart(index, call_id, raw.name))
            if members:
                deltas = ["{" + members[0]] + [", " + m for m in members[1:]]
                deltas[-1] += "}"
            else:
                deltas = ["{}"]
            events.extend(ToolCallArgumentsDelta(index, d) for d in deltas)
            call = ToolCall(call_id, raw.name, "".join(deltas))
            self.calls.append(call)
            events.append(ToolCallEnd(index, call))
        self.stats.calls = len(self.calls)
        self._region = ""
        return events


@dataclass(frozen=True)
class ParsedOutput:
    """Non-streaming result: answer content, structured calls and diagnostics."""

    content: str
    calls: tuple[ToolCall, ...]
    stats: ToolParseStats


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]], make_id: Callable[[], str] | None = None
) -> ParsedOutput:
    """Parse a complete answer text at once (same rules as streaming)."""
    p = ToolCallParser(tools, make_id)
    events = p.feed(text) + p.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return ParsedOutput(content, tuple(p.calls), p.stats)

"""Anthropic conversation content: `system` and `messages` lowered to template-form messages.

`lower_conversation(system, messages, vision=...)` validates the wire conversation and returns
a `Conversation`: the template-form messages (the dicts `GenerationRequest.messages` holds) in
input order, the block-level cache breakpoints found on the way, and whether the last message
is an Assistant prefill. Rules (docs/serving.md, "Anthropic Messages"):

- top-level `system`: a string, or text blocks joined without separators, becomes the first
  system message. When it is an array whose *first* block is a text block starting exactly with
  `x-anthropic-billing-header:`, that block (and its cache_control) is consumed. Nothing else is.
- consecutive user or assistant messages are joined (blocks concatenated, no separators);
  `system` messages inside `messages` stay at their position.
- user turns: leading `tool_result` blocks become template `tool` messages, then the remaining
  text/image blocks one `user` message. After an assistant turn with tool_use blocks, the next
  user turn must lead with exactly one result per call id; results are reordered to call order.
  A conversation may begin with results (a truncated or imported history).
  `is_error: true` is written into the prompt as an `Error: ` prefix of the result text.
- assistant turns: thinking text (signatures ignored) -> `reasoning_content`, text ->
  `content`, tool_use -> `tool_calls` with the `input` object (member order kept) as arguments.
- images need --vision (400 vision_disabled); documents, search results, files, container
  uploads, redacted thinking and server-tool blocks are rejected naming the capability.
- a final assistant turn of text only is a prefill to continue; one with thinking, tool calls
  or media, or text ending in whitespace (as Anthropic's API), is refused; an empty final
  assistant turn is dropped. Any other message with empty content ("" or []) is refused.

Cache breakpoints (`Breakpoint`) carry where the marked block ends (`CachePoint`): after its
text or image inside the template message's content, after its tool call, or, for a tool_result
block, after the whole result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.api.service.generation import CachePoint, content_units
from ninfer.api.wire import errors
from ninfer.api.wire.fields import get_bool, get_enum, get_object, get_str, require_object

BILLING_HEADER = "x-anthropic-billing-header:"
CACHE_TTLS = ("5m", "1h")
ERROR_PREFIX = "Error: "

# Block types refused with the capability they would need.
_UNSUPPORTED_BLOCKS = {
    "document": "document input (PDF and text documents)",
    "search_result": "search result blocks and citations",
    "container_upload": "container uploads (no code-execution container)",
    "tool_reference": "tool references (no tool search)",
    "redacted_thinking": "encrypted redacted-thinking restore",
    "server_tool_use": "Anthropic server tools (no server-side executor)",
    "mcp_tool_use": "MCP tools",
    "mcp_tool_result": "MCP tools",
}
_SERVER_RESULT = "server-tool results (no server-side executor)"


@dataclass(frozen=True)
class Breakpoint:
    """A cache_control marker on one block. `serial` identifies the block (wire order over
    tools, system and messages); `point` is where the block ends in the prompt."""

    serial: int
    ttl: str
    point: CachePoint | None
    param: str


@dataclass
class Conversation:
    """The lowered conversation (see the module docstring)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    breakpoints: list[Breakpoint] = field(default_factory=list)
    prefill: bool = False
    has_media: bool = False
    last_cacheable: tuple[int, CachePoint | None, str] | None = None  # (serial, point, param)


def parse_cache_control(obj: dict[str, Any], param: str) -> str | None:
    """The TTL of `obj`'s `cache_control` ("5m" when omitted), or None without one. `param`
    is the path of `obj` ("" for the request itself)."""
    where = f"{param}.cache_control" if param else "cache_control"
    cc = get_object(obj, "cache_control", where)
    if cc is None:
        return None
    get_enum(cc, "type", ("ephemeral",), f"{where}.type", required=True)
    ttl = get_str(cc, "ttl", f"{where}.ttl")
    if ttl is None:
        return "5m"
    if ttl not in CACHE_TTLS:
        raise errors.invalid_value(f"{where}.ttl", f"must be '5m' or '1h', got {ttl!r}")
    return ttl


# A lowered tool_result: (call id, template tool message, [(block, param, end offset)]).
_Result = tuple[str, dict[str, Any], list[tuple[dict[str, Any], str, int]]]


def _unit_ends(parts: list[tuple[dict[str, Any], str]], start: int) -> list[int]:
    """Where each validated text/image block ends in the content it is lowered into, in
    `CachePoint.offset` units (a character of text, one per image), counting from `start`."""
    ends, units = [], start
    for block, _ in parts:
        units += len(block.get("text") or "") if block.get("type") == "text" else 1
        ends.append(units)
    return ends


class _Lowering:
    """One pass over the conversation; `serial` numbers cacheable blocks in wire order."""

    def __init__(self, vision: bool, first_serial: int) -> None:
        self.vision = vision
        self.serial = first_serial
        self.out = Conversation()

    # -- blocks ------------------------------------------------------------------------------

    def mark(self, block: dict[str, Any], param: str, point: CachePoint | None) -> int:
        """Register a cacheable block: its breakpoint (if any) and last-cacheable position."""
        serial = self.serial
        self.serial += 1
        ttl = parse_cache_control(block, param)
        if ttl is not None:
            self.out.breakpoints.append(Breakpoint(serial, ttl, point, param))
        self.out.last_cacheable = (serial, point, param)
        return serial

    def text(self, block: dict[str, Any], param: str) -> str:
        text = get_str(block, "text", f"{param}.text", required=True)
        cites = block.get("citations")
        if cites is not None and not isinstance(cites, list):
            raise errors.invalid_type(f"{param}.citations", "an array", cites)
        return text  # type: ignore[return-value]

    def image(self, block: dict[str, Any], param: str) -> dict[str, Any]:
        src = get_object(block, "source", f"{param}.source", required=True)
        sparam = f"{param}.source"
        kind = get_str(src, "type", f"{sparam}.type", required=True)
        if kind == "file":
            raise errors.unsupported_value(f"{sparam}.type", kind, "the Files API (no file store)")
        if kind == "base64":
            media = get_str(src, "media_type", f"{sparam}.media_type", required=True)
            data = get_str(src, "data", f"{sparam}.data", required=True)
            url = f"data:{media};base64,{data}"
        elif kind == "url":
            url = get_str(src, "url", f"{sparam}.url", required=True)  # type: ignore[assignment]
        else:
            raise errors.invalid_value(f"{sparam}.type", f"must be 'base64' or 'url', got {kind!r}")
        if not self.vision:
            raise errors.vision_disabled(param)
        if not url.lower().startswith(("http://", "https://", "data:")):
            raise errors.invalid_media(f"{sparam}.url", "image source must be an http(s) URL")
        self.out.has_media = True
        return {"type": "image", "url": url, "param": sparam}

    def refuse(self, kind: str, param: str, role: str) -> None:
        if kind in _UNSUPPORTED_BLOCKS:
            raise errors.unsupported_value(f"{param}.type", kind, _UNSUPPORTED_BLOCKS[kind])
        if kind.endswith("_tool_result"):
            raise errors.unsupported_value(f"{param}.type", kind, _SERVER_RESULT)
        raise errors.invalid_value(
            f"{param}.type", f"block type {kind!r} is not valid in a {role} message"
        )

    # -- messages ------------------------------------------------------------------------------

    def system(self, content: Any, param: str, top_level: bool) -> None:
        """A system value (string or text blocks) as one system message, if it has any text."""
        index = len(self.out.messages)
        if isinstance(content, str):
            if content:
                self.out.messages.append({"role": "system", "content": content})
            return
        if not isinstance(content, list):
            raise errors.invalid_type(param, "a string or an array of text blocks", content)
        blocks = [require_object(b, f"{param}[{i}]") for i, b in enumerate(content)]
        start = 0
        if top_level and blocks and blocks[0].get("type") == "text":
            first = blocks[0].get("text")
            if isinstance(first, str) and first.startswith(BILLING_HEADER):
                start = 1  # Claude Code attribution metadata: consumed with its cache_control
        texts: list[str] = []
        offset = 0
        for i in range(start, len(blocks)):
            bparam = f"{param}[{i}]"
            kind = get_str(blocks[i], "type", f"{bparam}.type", required=True)
            if kind != "text":
                raise errors.invalid_value(
                    f"{bparam}.type", f"system blocks must be text, got {kind!r}"
                )
            texts.append(self.text(blocks[i], bparam))
            offset += len(texts[-1])
            self.mark(blocks[i], bparam, CachePoint(message=index, offset=offset))
        if start < len(blocks):
            self.out.messages.append({"role": "system", "content": "".join(texts)})

    def assistant(self, blocks: list[tuple[dict[str, Any], str]]) -> list[str]:
        """Append one assistant message; returns its tool_use ids in call order."""
        index = len(self.out.messages)
        texts: list[str] = []
        thinking: list[str] | None = None
        calls: list[dict[str, Any]] = []
        ids: list[str] = []
        points: list[tuple[dict[str, Any], str, CachePoint]] = []  # where each block ends
        offset = 0
        for block, param in blocks:
            kind = get_str(block, "type", f"{param}.type", required=True)
            if kind == "text":
                texts.append(self.text(block, param))
                offset += len(texts[-1])
                points.append((block, param, CachePoint(message=index, offset=offset)))
            elif kind == "thinking":
                text = get_str(block, "thinking", f"{param}.thinking", required=True)
                get_str(block, "signature", f"{param}.signature")  # opaque; ignored on input
                if block.get("cache_control") is not None:
                    raise errors.invalid_value(
                        f"{param}.cache_control", "thinking blocks cannot carry cache_control"
                    )
                thinking = (thinking or []) + [text]  # type: ignore[list-item]
            elif kind == "tool_use":
                call_id = get_str(block, "id", f"{param}.id", required=True, nonempty=True)
                name = get_str(block, "name", f"{param}.name", required=True, nonempty=True)
                args = get_object(block, "input", f"{param}.input", required=True)
                if call_id in ids:
                    raise errors.invalid_value(
                        f"{param}.id", f"tool_use id {call_id!r} is used twice"
                    )
                ids.append(call_id)  # type: ignore[arg-type]
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": args},
                    }
                )
                points.append((block, param, CachePoint(message=index, tool_call=len(calls) - 1)))
            elif kind == "image":
                raise errors.invalid_value(
                    f"{param}.type", "assistant messages cannot contain images"
                )
            else:
                self.refuse(kind, param, "assistant")  # type: ignore[arg-type]
        for block, param, point in points:
            self.mark(block, param, point)
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if thinking is not None:
            msg["reasoning_content"] = "".join(thinking)
        if calls:
            msg["tool_calls"] = calls
        self.out.messages.append(msg)
        return ids

    def user(
        self, blocks: list[tuple[dict[str, Any], str]], pending: list[str] | None, param: str
    ) -> None:
        """Append the tool results and the user message of one user turn.

        `pending`: call ids of the previous assistant turn (None when there was no assistant
        turn yet, so results may appear unmatched)."""
        results: list[_Result] = []
        rest: list[tuple[dict[str, Any], str]] = []
        for block, bparam in blocks:
            kind = get_str(block, "type", f"{bparam}.type", required=True)
            if kind == "tool_result":
                if rest:
                    raise errors.invalid_value(
                        f"{bparam}.type",
                        "tool_result blocks must come before other content in a user turn",
                    )
                results.append(self.tool_result(block, bparam))
            elif kind in ("text", "image"):
                rest.append((block, bparam))
            elif kind == "thinking":
                raise errors.invalid_value(
                    f"{bparam}.type", "thinking blocks belong to assistant messages"
                )
            elif kind == "tool_use":
                raise errors.invalid_value(
                    f"{bparam}.type", "tool_use blocks belong to assistant messages"
                )
            else:
                self.refuse(kind, bparam, "user")  # type: ignore[arg-type]
        results = self.match_results(results, pending, param)
        for call_id, msg, parts in results:
            index = len(self.out.messages)
            self.out.messages.append(msg)
            for block, bparam, offset in parts:  # the inner blocks, then the result itself
                self.mark(block, bparam, CachePoint(message=index, offset=offset))
        if rest or not results:
            index = len(self.out.messages)
            self.out.messages.append({"role": "user", "content": self.content(rest)})
            for (block, bparam), offset in zip(rest, _unit_ends(rest, 0)):
                self.mark(block, bparam, CachePoint(message=index, offset=offset))

    def content(self, parts: list[tuple[dict[str, Any], str]]) -> str | list[dict[str, Any]]:
        """Text joined without separators, or ordered text/image items when there is media."""
        items: list[dict[str, Any]] = []
        for block, bparam in parts:
            if block["type"] == "image":
                items.append(self.image(block, bparam))
            elif items and items[-1]["type"] == "text":
                items[-1]["text"] += self.text(block, bparam)
            else:
                items.append({"type": "text", "text": self.text(block, bparam)})
        if any(i["type"] == "image" for i in items):
            return items
        return "".join(i["text"] for i in items)

    def tool_result(self, block: dict[str, Any], param: str) -> _Result:
        """(call id, template tool message, its cacheable blocks with the content offset where
        each ends: the inner blocks, then the result block itself at the end)."""
        call_id = get_str(
            block, "tool_use_id", f"{param}.tool_use_id", required=True, nonempty=True
        )
        is_error = bool(get_bool(block, "is_error", f"{param}.is_error"))
        raw = block.get("content")
        parts: list[tuple[dict[str, Any], str]] = []
        if raw is None or isinstance(raw, str):
            text_parts: list[tuple[dict[str, Any], str]] = [
                ({"type": "text", "text": raw or ""}, param)
            ]
        elif isinstance(raw, list):
            text_parts = []
            for i, inner in enumerate(raw):
                iparam = f"{param}.content[{i}]"
                inner = require_object(inner, iparam)
                kind = get_str(inner, "type", f"{iparam}.type", required=True)
                if kind not in ("text", "image"):
                    self.refuse(kind, iparam, "tool_result")  # type: ignore[arg-type]
                text_parts.append((inner, iparam))
                parts.append((inner, iparam))
        else:
            raise errors.invalid_type(f"{param}.content", "a string or an array of blocks", raw)
        content = self.content(text_parts)
        if is_error:
            if isinstance(content, str):
                content = ERROR_PREFIX + content
            elif content and content[0]["type"] == "text":
                content[0]["text"] = ERROR_PREFIX + content[0]["text"]
            else:
                content.insert(0, {"type": "text", "text": ERROR_PREFIX})
        shift = len(ERROR_PREFIX) if is_error else 0
        ends = [(b, p, o + shift) for (b, p), o in zip(parts, _unit_ends(parts, 0))]
        ends.append((block, param, content_units(content)))  # the result block ends the message
        msg = {"role": "tool", "tool_call_id": call_id, "content": content}
        return call_id, msg, ends

    def match_results(
        self,
        results: list[_Result],
        pending: list[str] | None,
        param: str,
    ) -> list[_Result]:
        """Check the results against the previous turn's calls; return them in call order."""
        by_id: dict[str, _Result] = {}
        for r in results:
            if r[0] in by_id:
                raise errors.invalid_value(
                    param, f"tool_use_id {r[0]!r} has more than one tool_result"
                )
            by_id[r[0]] = r
        if pending is None:  # a history that begins with results
            return results
        if not pending:
            if results:
                raise errors.invalid_value(
                    param,
                    "tool_result blocks must answer tool_use blocks of the preceding assistant turn",
                )
            return results
        unknown = [i for i in by_id if i not in pending]
        missing = [i for i in pending if i not in by_id]
        if unknown:
            raise errors.invalid_value(
                param,
                f"tool_result for unknown tool_use id(s) {', '.join(unknown)}: the preceding "
                f"assistant turn called {', '.join(pending)}",
            )
        if missing:
            raise errors.invalid_value(
                param,
                f"the preceding assistant turn called tools without results: {', '.join(missing)}",
            )
        return [by_id[i] for i in pending]


Role = Literal["user", "assistant", "system"]


def _turns(
    raw_messages: list[Any],
) -> list[tuple[Role, list[tuple[dict[str, Any], str]], str, Any]]:
    """Wire messages grouped into turns: consecutive user / assistant messages joined.

    Each turn: (role, [(block, param)], param of its first message, raw system content)."""
    turns: list[tuple[Role, list[tuple[dict[str, Any], str]], str, Any]] = []
    for i, raw in enumerate(raw_messages):
        param = f"messages[{i}]"
        msg = require_object(raw, param)
        role = get_enum(
            msg, "role", ("user", "assistant", "system"), f"{param}.role", required=True
        )
        content = msg.get("content")
        if content is None:
            raise errors.missing(f"{param}.content")
        if role == "system":
            turns.append(("system", [], param, content))
            continue
        if content in ("", []) and not (role == "assistant" and i == len(raw_messages) - 1):
            raise errors.invalid_value(
                f"{param}.content",
                "must be non-empty (only a final assistant message may be empty)",
            )
        if isinstance(content, str):
            blocks = [({"type": "text", "text": content}, f"{param}.content")]
        elif isinstance(content, list):
            blocks = [
                (require_object(b, f"{param}.content[{j}]"), f"{param}.content[{j}]")
                for j, b in enumerate(content)
            ]
        else:
            raise errors.invalid_type(
                f"{param}.content", "a string or an array of content blocks", content
            )
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks, param, None))  # type: ignore[arg-type]
    return turns


def lower_conversation(
    system: Any, raw_messages: Any, *, vision: bool, first_serial: int = 0
) -> Conversation:
    """Validate and lower `system` and `messages` (see the module docstring). `first_serial`
    numbers the first cacheable block (tools come before the conversation)."""
    low = _Lowering(vision, first_serial)
    if system is not None:
        low.system(system, "system", top_level=True)
    if raw_messages is None:
        raise errors.missing("messages")
    if not isinstance(raw_messages, list):
        raise errors.invalid_type("messages", "an array", raw_messages)
    if not raw_messages:
        raise errors.invalid_value("messages", "must contain at least one message")
    turns = _turns(raw_messages)
    pending: list[str] | None = None  # None until the first assistant turn
    for n, (role, blocks, param, sys_content) in enumerate(turns):
        if role == "system":
            low.system(sys_content, f"{param}.content", top_level=False)
        elif role == "user":
            low.user(blocks, pending, param)
            pending = []
        else:
            if pending:
                raise errors.invalid_value(
                    param,
                    f"tool_use id(s) {', '.join(pending)} have no tool_result in the next user turn",
                )
            if n == len(turns) - 1:
                _final_assistant(low, blocks, param)
                break
            pending = low.assistant(blocks)
    return low.out


def _final_assistant(low: _Lowering, blocks: list[tuple[dict[str, Any], str]], param: str) -> None:
    """The last turn is an assistant's: a text-only prefill to continue (or empty: dropped)."""
    for block, bparam in blocks:
        kind = get_str(block, "type", f"{bparam}.type", required=True)
        if kind == "thinking":
            raise errors.unsupported_value(
                f"{bparam}.type", kind, "an assistant prefill that contains thinking"
            )
        if kind == "tool_use":
            raise errors.unsupported_value(
                f"{bparam}.type", kind, "an assistant prefill that contains tool calls"
            )
        if kind == "image":
            raise errors.unsupported_value(
                f"{bparam}.type", kind, "an assistant prefill that contains media"
            )
        if kind != "text":
            low.refuse(kind, bparam, "assistant")  # type: ignore[arg-type]
    text = "".join(low.text(b, p) for b, p in blocks)
    if not text.strip():
        for block, bparam in blocks:  # still validate the markers
            parse_cache_control(block, bparam)
        return
    if text != text.rstrip():  # a template would trim it: the prompt could not end with it
        raise errors.invalid_value(
            f"{param}.content", "a final assistant message cannot end with trailing whitespace"
        )
    low.assistant(blocks)
    low.out.prefill = True

"""OpenAI chat messages: the normalized conversation and the parser of `messages`.

A `ChatMessage` is one turn in input order with its content as ordered parts (text and media),
assistant reasoning and tool calls, or a tool result. `parse_message` validates one element of
a Chat Completions `messages` array and raises a field-specific `ApiError` (400) naming it, e.g.
``messages[2].content[0].image_url.detail``. Normalization rules:

- string content and text/refusal parts keep their bytes; adjacent parts join without a
  separator; empty wire content is an empty turn (no parts);
- assistant `reasoning` is an alias of `reasoning_content`;
- legacy `function` results become role "tool" with `name`; legacy assistant `function_call`
  becomes a ToolCall without id;
- a string `name` on a tool message is accepted and ignored; a non-empty name on any other
  role is refused (the chat template cannot represent participants);
- image_url (user messages and tool results) and video_url (user messages) parts need the
  server's --vision (else 400 vision_disabled); image detail must be omitted or "auto".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.api.wire import errors
from ninfer.api.wire.fields import (
    get_array,
    get_enum,
    get_object,
    get_str,
    json_object_text,
    require_object,
)

Role = Literal["system", "developer", "user", "assistant", "tool"]


@dataclass(frozen=True)
class TextPart:
    """Text of a message (a string content, a `text` part or a `refusal` part)."""

    text: str
    cache_breakpoint: bool = False  # prompt_cache_breakpoint {"mode": "explicit"} on this part


@dataclass(frozen=True)
class MediaPart:
    """An image or video input; `url` is http(s) or a data: URI (fetched/decoded later);
    `param` the field of its source, named in media errors."""

    kind: Literal["image", "video"]
    url: str
    cache_breakpoint: bool = False
    param: str = field(default="", compare=False)


ContentPart = TextPart | MediaPart


@dataclass(frozen=True)
class ToolCall:
    """A historical assistant tool call. `arguments` is the JSON text as the client sent it (an
    object given instead of a string is serialised with its member order kept)."""

    id: str | None
    name: str
    arguments: str

    def template_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class ChatMessage:
    """One turn, in input order.

    Legacy `function` results become role "tool" with `name` set and no tool_call_id; legacy
    assistant `function_call` becomes a ToolCall without id. Empty content is kept as an empty
    turn (no parts).
    """

    role: Role
    parts: tuple[ContentPart, ...] = ()
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        """The text parts concatenated without separators (media parts skipped)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def media(self) -> tuple[MediaPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, MediaPart))

    def template_dict(self) -> dict[str, Any]:
        """The Hugging Face chat-template form: content is a string, or, when the message has
        media, a list of {"type": "text", "text"} / {"type": "image" | "video", "url", "param"}
        items with adjacent text parts joined (the service takes the sources out before
        rendering: ninfer.api.service.media_prompt)."""
        out: dict[str, Any] = {"role": self.role}
        if self.media:
            items: list[dict[str, Any]] = []
            for p in self.parts:
                if isinstance(p, MediaPart):
                    items.append({"type": p.kind, "url": p.url, "param": p.param})
                elif items and items[-1]["type"] == "text":
                    items[-1]["text"] += p.text
                else:
                    items.append({"type": "text", "text": p.text})
            out["content"] = items
        else:
            out["content"] = self.text
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [c.template_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


# -----------------------------------------------------------------------------------------------
# Messages
# -----------------------------------------------------------------------------------------------

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def parse_message(raw: Any, param: str, vision: bool) -> ChatMessage:
    """Validate one `messages` element found at `param`; `vision` is the server's --vision."""
    msg = require_object(raw, param)
    role = get_enum(msg, "role", _ROLES, f"{param}.role", required=True)
    name = msg.get("name")
    if role in ("tool", "function"):
        if name is not None and not isinstance(name, str):
            raise errors.invalid_type(f"{param}.name", "a string", name)
    elif name is not None:
        if not isinstance(name, str):
            raise errors.invalid_type(f"{param}.name", "a string", name)
        if name:
            raise errors.unsupported_parameter(
                f"{param}.name", "participant names (the chat template cannot represent them)"
            )
    if msg.get("audio") is not None:
        raise errors.unsupported_parameter(f"{param}.audio", "audio output history")

    if role == "assistant":
        return _parse_assistant(msg, param)
    if role == "function":  # legacy function result
        fname = get_str(msg, "name", f"{param}.name", required=True, nonempty=True)
        parts = _parse_content(msg, param, role, vision, required=False)
        return ChatMessage("tool", parts, name=fname)
    parts = _parse_content(msg, param, role, vision, required=True)
    if role == "tool":
        call_id = get_str(msg, "tool_call_id", f"{param}.tool_call_id", required=True)
        return ChatMessage("tool", parts, tool_call_id=call_id)
    return ChatMessage(role, parts)  # type: ignore[arg-type]


def _parse_assistant(msg: dict[str, Any], param: str) -> ChatMessage:
    parts = list(_parse_content(msg, param, "assistant", vision=False, required=False))
    refusal = get_str(msg, "refusal", f"{param}.refusal")
    if refusal:
        parts.append(TextPart(refusal))
    reasoning = get_str(msg, "reasoning_content", f"{param}.reasoning_content")
    alias = get_str(msg, "reasoning", f"{param}.reasoning")
    if reasoning is not None and alias is not None and reasoning != alias:
        raise errors.invalid_value(
            f"{param}.reasoning", "differs from reasoning_content; send one of them"
        )
    calls = [
        _parse_tool_call(c, f"{param}.tool_calls[{j}]")
        for j, c in enumerate(get_array(msg, "tool_calls", f"{param}.tool_calls") or [])
    ]
    fc = get_object(msg, "function_call", f"{param}.function_call")
    if fc is not None:  # legacy function-call history
        calls.append(
            ToolCall(
                None,
                _call_name(fc, f"{param}.function_call"),
                _arguments(fc, f"{param}.function_call"),
            )
        )
    return ChatMessage(
        "assistant", tuple(parts), reasoning if reasoning is not None else alias, tuple(calls)
    )


def _parse_tool_call(raw: Any, param: str) -> ToolCall:
    call = require_object(raw, param)
    kind = get_str(call, "type", f"{param}.type")
    if kind not in (None, "function"):
        raise errors.unsupported_value(f"{param}.type", kind, "custom (non-function) tool calls")
    call_id = get_str(call, "id", f"{param}.id")
    fn = get_object(call, "function", f"{param}.function", required=True)
    return ToolCall(
        call_id, _call_name(fn, f"{param}.function"), _arguments(fn, f"{param}.function")
    )


def _call_name(fn: dict[str, Any], param: str) -> str:
    return get_str(fn, "name", f"{param}.name", required=True, nonempty=True)  # type: ignore[return-value]


def _arguments(fn: dict[str, Any], param: str) -> str:
    """The call's arguments as JSON text of an object. Text that is not (`"{"`, `"[1]"`) is
    refused here, as Responses refuses a function_call Item's: the template could not render it
    as parameters, and silently dropping or rewriting it would change the model's history."""
    args = fn.get("arguments")
    if args is None:
        return "{}"
    if isinstance(args, dict):  # some clients send the object itself; member order is kept
        return json.dumps(args, ensure_ascii=False)
    return json_object_text(args, f"{param}.arguments", "a JSON string")


def _parse_content(
    msg: dict[str, Any], param: str, role: str, vision: bool, *, required: bool
) -> tuple[ContentPart, ...]:
    """String content, or ordered parts. Empty wire content is an empty turn (no parts)."""
    content = msg.get("content")
    cparam = f"{param}.content"
    if content is None:
        if required:
            raise errors.missing(cparam)
        return ()
    if isinstance(content, str):
        return (TextPart(content),) if content else ()
    if not isinstance(content, list):
        raise errors.invalid_type(cparam, "a string or an array of content parts", content)
    return tuple(
        p
        for i, raw in enumerate(content)
        if (p := _parse_part(raw, f"{cparam}[{i}]", role, vision)) is not None
    )


def _parse_part(raw: Any, param: str, role: str, vision: bool) -> ContentPart | None:
    part = require_object(raw, param)
    kind = get_str(part, "type", f"{param}.type", required=True)
    breakpoint_ = _parse_breakpoint(part, param)
    if kind == "text":
        text = get_str(part, "text", f"{param}.text", required=True)
        return TextPart(text, breakpoint_) if text or breakpoint_ else None  # type: ignore[arg-type]
    if kind == "refusal":
        if role != "assistant":
            raise errors.invalid_value(
                f"{param}.type", "refusal parts belong to assistant messages"
            )
        text = get_str(part, "refusal", f"{param}.refusal", required=True)
        return TextPart(text, breakpoint_) if text or breakpoint_ else None  # type: ignore[arg-type]
    if kind in ("image_url", "video_url"):
        media = "image" if kind == "image_url" else "video"
        if not (role == "user" or (role in ("tool", "function") and media == "image")):
            raise errors.invalid_value(
                f"{param}.type",
                f"{kind} parts are accepted in user messages"
                + (" and tool results" if media == "image" else ""),
            )
        return _parse_media(part, kind, media, param, vision, breakpoint_)
    if kind == "input_audio":
        raise errors.unsupported_value(f"{param}.type", kind, "audio input")
    if kind == "file":
        raise errors.unsupported_value(f"{param}.type", kind, "file input")
    raise errors.invalid_value(f"{param}.type", f"unknown content part type {kind!r}")


def _parse_media(
    part: dict[str, Any], kind: str, media: str, param: str, vision: bool, bp: bool
) -> MediaPart:
    src = part.get(kind)
    sparam = f"{param}.{kind}"
    if isinstance(src, str):  # string-form URL extension
        url = src
    else:
        obj = get_object(part, kind, sparam, required=True)
        url = get_str(obj, "url", f"{sparam}.url", required=True)  # type: ignore[assignment]
        detail = get_str(obj, "detail", f"{sparam}.detail")
        if detail in ("low", "high"):
            raise errors.unsupported_value(
                f"{sparam}.detail", detail, "image detail levels (omit it or use 'auto')"
            )
        if detail not in (None, "auto"):
            raise errors.invalid_value(f"{sparam}.detail", f"must be 'auto', got {detail!r}")
        sparam = f"{sparam}.url"
    if not vision:
        raise errors.vision_disabled(param)
    lowered = url.lower()
    if not lowered.startswith(("http://", "https://", "data:")):
        raise errors.invalid_media(sparam, f"{media} source must be an http(s) URL or a data: URI")
    return MediaPart(media, url, bp, sparam)  # type: ignore[arg-type]


def _parse_breakpoint(part: dict[str, Any], param: str) -> bool:
    bp = get_object(part, "prompt_cache_breakpoint", f"{param}.prompt_cache_breakpoint")
    if bp is None:
        return False
    get_enum(bp, "mode", ("explicit",), f"{param}.prompt_cache_breakpoint.mode", required=True)
    return True

"""Responses input Items: validation of the wire `input` into canonical Items.

Two steps (docs/serving.md, "Responses input Items"):

1. `parse_input(value, "input", vision=...)` validates the wire `input` (a string or an Item
   array) into canonical Items: JSON-ready dicts in client order, each with an `id` (kept when
   supplied, generated otherwise: msg_/rs_/fc_/fco_), string content turned into typed parts.
   Canonical Items are what `GET /v1/responses/{id}/input_items` lists and what a stored chain
   replays. Duplicate ids fail.
2. `history.items_to_messages` lowers a conversation of canonical Items (the stored
   chain's Items followed by the new input) to chat-template messages.

A reasoning Item restores its text from raw `reasoning_text` content, or from the
`encrypted_content` token ninfer issued (`reasoning_seal`; `seal` given): the token is verified
(400 `invalid_encrypted_content` naming `input[i].encrypted_content` when tampered or foreign)
and its text becomes the Item's content.

Unsupported (400 naming the field): input_file, input_audio, image file_id, image detail other
than auto, reasoning with neither raw reasoning_text nor a token of this server, partial
(in-progress) tool Items, item references and every other Item or content type.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ninfer.api.responses.reasoning_seal import ReasoningSeal
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.api.wire.fields import (
    get_array,
    get_enum,
    get_object,
    get_str,
    json_object_text,
    require_object,
)

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
_PARTIAL = "partial tool Items (send completed calls and results)"


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


# -----------------------------------------------------------------------------------------------
# 1. Wire input -> canonical Items
# -----------------------------------------------------------------------------------------------


def parse_input(
    value: Any, param: str, *, vision: bool, seal: ReasoningSeal | None = None
) -> list[dict[str, Any]]:
    """Canonical Items of a wire `input` (see module docstring). Raises ApiError 400. An empty
    string, like an empty array, is empty input (no Item): the create request then needs a
    previous_response_id whose chain already holds a user message. `seal` opens reasoning
    `encrypted_content` tokens; without it such a token cannot stand in for raw content."""
    if value == "":
        return []
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}], None, {})]
    if not isinstance(value, list):
        raise errors.invalid_type(param, "a string or an array of Items", value)
    items = [_parse_item(raw, f"{param}[{i}]", vision, seal) for i, raw in enumerate(value)]
    check_unique_ids(items, param)
    return items


def check_unique_ids(items: Sequence[dict[str, Any]], param: str, offset: int = 0) -> None:
    """Every Item id occurs once; `offset` items at the front came from stored history."""
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item["id"] in seen:
            where = f"{param}[{i - offset}].id" if i >= offset else "previous_response_id"
            raise ApiError(
                400, f"Item id {item['id']!r} occurs more than once in the conversation",
                code="duplicate_item_id", param=where,
            )  # fmt: skip
        seen.add(item["id"])


def _message(
    role: str, content: list[dict[str, Any]], item_id: str | None, meta: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item_id or new_id("msg_"),
        "type": "message",
        "role": role,
        "content": content,
    }
    out.update(meta)
    return out


def _item_id(item: dict[str, Any], param: str) -> str | None:
    return get_str(item, "id", f"{param}.id", nonempty=True)


def _parse_item(raw: Any, param: str, vision: bool, seal: ReasoningSeal | None) -> dict[str, Any]:
    item = require_object(raw, param)
    kind = get_str(item, "type", f"{param}.type")
    if kind is None:
        if "role" not in item:
            raise errors.missing(f"{param}.type")
        kind = "message"
    if kind == "message":
        return _parse_message(item, param, vision)
    if kind == "reasoning":
        return _parse_reasoning(item, param, seal)
    if kind == "function_call":
        return _parse_call(item, param)
    if kind == "function_call_output":
        return _parse_result(item, param, vision)
    raise errors.unsupported_value(f"{param}.type", kind, f"{kind} Items")


def _status_meta(item: dict[str, Any], param: str) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key in ("status", "phase"):
        value = get_str(item, key, f"{param}.{key}")
        if value is not None:
            meta[key] = value
    return meta


def _parse_message(item: dict[str, Any], param: str, vision: bool) -> dict[str, Any]:
    role = get_enum(item, "role", MESSAGE_ROLES, f"{param}.role", required=True)
    content = item.get("content")
    cparam = f"{param}.content"
    if content is None:
        raise errors.missing(cparam)
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        parts = [_text_part(kind, content)]
    elif isinstance(content, list):
        parts = [_parse_part(p, f"{cparam}[{j}]", role, vision) for j, p in enumerate(content)]  # type: ignore[arg-type]
    else:
        raise errors.invalid_type(cparam, "a string or an array of content parts", content)
    return _message(role, parts, _item_id(item, param), _status_meta(item, param))  # type: ignore[arg-type]


def _text_part(kind: str, text: str) -> dict[str, Any]:
    part: dict[str, Any] = {"type": kind, "text": text}
    if kind == "output_text":
        part["annotations"] = []
    return part


def _parse_breakpoint(part: dict[str, Any], param: str) -> bool:
    bp = get_object(part, "prompt_cache_breakpoint", f"{param}.prompt_cache_breakpoint")
    if bp is None:
        return False
    get_enum(bp, "mode", ("explicit",), f"{param}.prompt_cache_breakpoint.mode", required=True)
    return True


def _parse_part(raw: Any, param: str, role: str, vision: bool) -> dict[str, Any]:
    """One message content part (role decides which kinds are allowed)."""
    part = require_object(raw, param)
    kind = get_str(part, "type", f"{param}.type", required=True)
    bp = _parse_breakpoint(part, param)
    if kind == "input_text":
        out = {"type": kind, "text": get_str(part, "text", f"{param}.text", required=True)}
    elif kind in ("output_text", "refusal"):
        if role != "assistant":
            raise errors.invalid_value(
                f"{param}.type", f"{kind} parts belong to assistant messages"
            )
        key = "text" if kind == "output_text" else "refusal"
        out = {"type": kind, key: get_str(part, key, f"{param}.{key}", required=True)}
        if kind == "output_text":
            out["annotations"] = get_array(part, "annotations", f"{param}.annotations") or []
            get_array(part, "logprobs", f"{param}.logprobs")
    elif kind in ("input_image", "input_video"):
        if role not in (("user", "assistant") if kind == "input_image" else ("user",)):
            raise errors.invalid_value(
                f"{param}.type", f"{kind} parts are accepted in "
                + ("user and assistant messages" if kind == "input_image" else "user messages"),
            )  # fmt: skip
        out = _parse_media(part, kind, param, vision)
    elif kind in ("input_file", "input_audio"):
        raise errors.unsupported_value(f"{param}.type", kind, "file and audio input")
    else:
        raise errors.unsupported_value(f"{param}.type", kind, f"{kind} content parts")
    if bp:
        if kind not in ("input_text", "input_image"):
            raise errors.invalid_value(
                f"{param}.prompt_cache_breakpoint",
                "is accepted on input_text and input_image parts",
            )
        out["prompt_cache_breakpoint"] = {"mode": "explicit"}
    return out


def _parse_media(part: dict[str, Any], kind: str, param: str, vision: bool) -> dict[str, Any]:
    key = "image_url" if kind == "input_image" else "video_url"
    if part.get("file_id") is not None:
        raise errors.unsupported_parameter(
            f"{param}.file_id", "file uploads (send a URL or data URI)"
        )
    detail = get_str(part, "detail", f"{param}.detail")
    if detail not in (None, "auto"):
        raise errors.unsupported_value(
            f"{param}.detail", detail, "image detail levels (omit it or use 'auto')"
        )
    url = get_str(part, key, f"{param}.{key}", required=True)
    if not vision:
        raise errors.vision_disabled(param)
    if not url.lower().startswith(("http://", "https://", "data:")):  # type: ignore[union-attr]
        raise errors.invalid_media(
            f"{param}.{key}", "the source must be an http(s) URL or a data: URI"
        )
    out: dict[str, Any] = {"type": kind, key: url}
    if kind == "input_image":
        out["detail"] = "auto"
    return out


def _parse_reasoning(
    item: dict[str, Any], param: str, seal: ReasoningSeal | None
) -> dict[str, Any]:
    content = get_array(item, "content", f"{param}.content")
    summary = get_array(item, "summary", f"{param}.summary") or []
    for j, s in enumerate(summary):
        sp = require_object(s, f"{param}.summary[{j}]")
        get_str(sp, "text", f"{param}.summary[{j}].text", required=True)
    encrypted = get_str(item, "encrypted_content", f"{param}.encrypted_content")
    sealed = None
    if encrypted is not None and seal is not None:
        sealed = seal.open(encrypted, f"{param}.encrypted_content")
    parts = []
    for j, raw in enumerate(content or []):
        cp = require_object(raw, f"{param}.content[{j}]")
        kind = get_str(cp, "type", f"{param}.content[{j}].type", required=True)
        if kind != "reasoning_text":
            raise errors.unsupported_value(
                f"{param}.content[{j}].type", kind, "reasoning content other than reasoning_text"
            )
        parts.append(
            {
                "type": "reasoning_text",
                "text": get_str(cp, "text", f"{param}.content[{j}].text", required=True),
            }
        )
    if sealed is not None:
        # the token is the server's own record of the reasoning: raw content sent beside it
        # must say the same, or one of them was edited
        if parts and "".join(p["text"] for p in parts) != sealed:
            raise errors.invalid_value(
                f"{param}.encrypted_content",
                "holds reasoning that differs from the Item's content (send one, or both unchanged)",
            )
        parts = parts or [{"type": "reasoning_text", "text": sealed}]
    elif not parts:  # absent, or no raw text: metadata alone cannot restore reasoning
        if summary or encrypted:
            raise errors.unsupported_value(
                f"{param}.content", None,
                "reasoning replay without raw reasoning_text or a reasoning token of this server",
            )  # fmt: skip
        if content is None:
            raise errors.missing(f"{param}.content")
    return _reasoning_item(item, param, parts, summary, encrypted)


def _reasoning_item(
    item: dict[str, Any], param: str, parts: list[dict[str, Any]], summary: list[Any],
    encrypted: str | None,
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {
        "id": _item_id(item, param) or new_id("rs_"),
        "type": "reasoning",
        "summary": summary,
        "content": parts,
    }
    if encrypted is not None:
        out["encrypted_content"] = encrypted
    status = get_str(item, "status", f"{param}.status")
    if status is not None:
        out["status"] = status
    return out


def _completed(item: dict[str, Any], param: str) -> None:
    status = get_str(item, "status", f"{param}.status")
    if status not in (None, "completed"):
        raise errors.unsupported_value(f"{param}.status", status, _PARTIAL)


def _parse_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    _completed(item, param)
    call_id = get_str(item, "call_id", f"{param}.call_id", required=True, nonempty=True)
    name = get_str(item, "name", f"{param}.name", required=True, nonempty=True)
    namespace = get_str(item, "namespace", f"{param}.namespace", nonempty=True)
    args = item.get("arguments")
    if args is None:
        raise errors.missing(f"{param}.arguments")
    args = json_object_text(args, f"{param}.arguments", "a JSON object string")
    out: dict[str, Any] = {
        "id": _item_id(item, param) or new_id("fc_"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
    }
    if namespace is not None:
        out["namespace"] = namespace
    out["arguments"] = args
    out["status"] = "completed"
    return out


def _parse_result(item: dict[str, Any], param: str, vision: bool) -> dict[str, Any]:
    _completed(item, param)
    call_id = get_str(item, "call_id", f"{param}.call_id", required=True, nonempty=True)
    output = item.get("output")
    oparam = f"{param}.output"
    if output is None:
        raise errors.missing(oparam)
    if isinstance(output, list):
        if not output:
            raise errors.invalid_value(oparam, "must be a string or a non-empty array of parts")
        parts = []
        for j, raw in enumerate(output):
            p = require_object(raw, f"{oparam}[{j}]")
            kind = get_str(p, "type", f"{oparam}[{j}].type", required=True)
            if kind not in ("input_text", "input_image"):
                raise errors.unsupported_value(
                    f"{oparam}[{j}].type", kind, "tool results other than text and images"
                )
            parts.append(_parse_part(p, f"{oparam}[{j}]", "user", vision))
        output = parts
    elif not isinstance(output, str):
        raise errors.invalid_type(oparam, "a string or an array of parts", output)
    out: dict[str, Any] = {
        "id": _item_id(item, param) or new_id("fco_"),
        "type": "function_call_output",
        "call_id": call_id,
        "output": output,
    }
    for key in ("name", "namespace"):
        value = get_str(item, key, f"{param}.{key}", nonempty=True)
        if value is not None:
            out[key] = value
    out["status"] = "completed"
    return out

"""Lowering a Responses conversation (canonical Items) to chat-template messages.

`items_to_messages(items, tools, ...)` takes the stored chain's Items followed by the new input
(all canonical, see items.py) and returns template-form messages plus prefix-cache write
points (docs/serving.md, "Responses input Items" and "Prompt caching hints"):

    reasoning* -> message(assistant)* -> function_call*   one assistant turn
    function_call_output+                               tool results, reordered to call order
    message(user | system | developer)                  one turn each, in position

Contiguous assistant-owned Items form one assistant turn in that order; anything that would
need rearranging fails with `invalid_assistant_history`. Results are matched by call_id to the
calls of the turn just before them; unknown, duplicate or partial result sets, and calls
that no function_call_output answers (OpenAI: "No tool output found for function call ..."),
fail with `invalid_tool_history`. Top-level `instructions` becomes a leading developer message for this
request only. Historical calls render under their internal engine name (tools.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ninfer.api.responses.tools import ToolSet
from ninfer.api.service.generation import CachePoint, content_units
from ninfer.api.service.prompt_cache import MAX_CACHE_WRITES
from ninfer.api.wire.errors import ApiError, invalid_tool_history


def invalid_assistant_history(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, code="invalid_assistant_history", param=param)


@dataclass(frozen=True)
class PromptMessages:
    """Template-form messages and the explicit prefix-cache write points (the latest four)."""

    messages: list[dict[str, Any]]
    cache_points: tuple[CachePoint, ...]


_PHASE = {"reasoning": 0, "message": 1, "function_call": 2}


def items_to_messages(
    items: Sequence[dict[str, Any]],
    tools: ToolSet,
    *,
    instructions: str | None = None,
    history: int = 0,
) -> PromptMessages:
    """Lower a conversation of canonical Items (see module docstring). The first `history`
    Items came from stored Responses (errors there name previous_response_id)."""

    def where(i: int) -> str:
        return f"input[{i - history}]" if i >= history else "previous_response_id"

    messages: list[dict[str, Any]] = []
    explicit: list[CachePoint] = []
    if instructions is not None:
        messages.append({"role": "developer", "content": instructions})
    turn: dict[str, Any] | None = None  # the assistant turn being grouped
    phase = -1
    # call_id -> (position, call Item) of the last assistant turn's calls
    pending: dict[str, tuple[int, dict[str, Any]]] = {}
    results: list[tuple[int, dict[str, Any]]] = []

    def flush_results() -> None:
        nonlocal pending
        if not results:
            return
        i0 = results[0][0]
        if len(results) != len(pending):
            missing = [c for c in pending if c not in {r["call_id"] for _, r in results}]
            raise invalid_tool_history(
                where(i0), f"tool results are missing for call_id {', '.join(map(repr, missing))}; "
                "send one function_call_output per call of the assistant turn",
            )  # fmt: skip
        by_id = {r["call_id"]: r for _, r in results}
        for call_id in pending:  # declaration order
            output = by_id[call_id]["output"]
            if not isinstance(output, str):
                explicit.extend(_marked_ends(output, len(messages), 0))
            messages.append(_result_message(by_id[call_id]))
        results.clear()
        pending = {}

    def close_calls() -> None:
        """End the last assistant turn's calls: its results must all be there (a turn whose
        calls got no result at all is refused as OpenAI refuses it)."""
        flush_results()
        if pending:
            first, _ = next(iter(pending.values()))
            raise invalid_tool_history(
                where(first), f"No tool output found for function call {', '.join(map(repr, pending))}; "
                "each function_call needs a function_call_output Item with its call_id after the "
                "assistant turn",
            )  # fmt: skip

    for i, item in enumerate(items):
        kind = item["type"]
        owned = kind in _PHASE and (kind != "message" or item["role"] == "assistant")
        if owned:
            flush_results()
            if turn is None:
                turn, phase, pending = {"role": "assistant", "content": ""}, -1, {}
                messages.append(turn)
            if _PHASE[kind] < phase:
                raise invalid_assistant_history(
                    where(i), f"a {kind} Item cannot follow a "
                    f"{'function_call' if phase == 2 else 'message'} Item of the same assistant turn; "
                    "an assistant turn is reasoning, then message content, then function calls",
                )  # fmt: skip
            phase = _PHASE[kind]
            if kind == "reasoning":
                turn["reasoning_content"] = turn.get("reasoning_content", "") + "".join(
                    p["text"] for p in item["content"]
                )
            elif kind == "message":
                before = content_units(turn["content"])
                explicit.extend(_marked_ends(item["content"], len(messages) - 1, before))
                _append_content(turn, item["content"])
            else:
                call_id = item["call_id"]
                if call_id in pending:
                    raise invalid_tool_history(
                        where(i), f"call_id {call_id!r} occurs twice in one assistant turn"
                    )
                pending[call_id] = (i, item)
                turn.setdefault("tool_calls", []).append({
                    "id": call_id, "type": "function",
                    "function": {"name": tools.internal(item.get("namespace"), item["name"]), "arguments": item["arguments"]},
                })  # fmt: skip
            continue
        turn = None
        if kind == "function_call_output":
            if item["call_id"] not in pending:
                raise invalid_tool_history(
                    where(i), f"function_call_output call_id {item['call_id']!r} does not answer a call "
                    "of the assistant turn before it",
                )  # fmt: skip
            call = pending[item["call_id"]][1]
            if any(r["call_id"] == item["call_id"] for _, r in results):
                raise invalid_tool_history(
                    where(i), f"call_id {item['call_id']!r} has more than one result"
                )
            for key in ("name", "namespace"):
                if key in item and item[key] != call.get(key):
                    raise invalid_tool_history(
                        f"{where(i)}.{key}",
                        f"{key} {item[key]!r} does not match the call's {call.get(key)!r}",
                    )
            results.append((i, item))
            continue
        close_calls()
        explicit.extend(_marked_ends(item["content"], len(messages), 0))
        messages.append(_input_message(item))
    close_calls()
    # The latest four explicit markers. The implicit candidate (end of the last message's text,
    # before its closing tokens) is placed by the service when a write slot is left
    # (`GenerationRequest.implicit_cache_point`).
    return PromptMessages(messages, tuple(explicit[-MAX_CACHE_WRITES:]))


def _marked_ends(parts: Sequence[dict[str, Any]], message: int, before: int) -> list[CachePoint]:
    """The ends of the parts carrying prompt_cache_breakpoint, as points of template message
    `message` whose content already holds `before` units (`CachePoint.offset`)."""
    out, units = [], before
    for p in parts:
        kind = p["type"]
        if kind in ("input_image", "input_video"):
            units += 1
        else:
            units += len(p["refusal"] if kind == "refusal" else p["text"])
        if "prompt_cache_breakpoint" in p:
            out.append(CachePoint(message=message, offset=units))
    return out


def _parts_content(parts: Sequence[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Template content: a string, or a list of text/image/video items when media is present
    (adjacent text joined, no separators inserted)."""
    items: list[dict[str, Any]] = []
    for p in parts:
        kind = p["type"]
        if kind in ("input_image", "input_video"):
            media = "image" if kind == "input_image" else "video"
            items.append(
                {"type": media, "url": p["image_url" if media == "image" else "video_url"]}
            )
            continue
        text = p["refusal"] if kind == "refusal" else p["text"]
        if items and items[-1]["type"] == "text":
            items[-1]["text"] += text
        else:
            items.append({"type": "text", "text": text})
    if all(it["type"] == "text" for it in items):
        return "".join(it["text"] for it in items)
    return items


def _append_content(turn: dict[str, Any], parts: Sequence[dict[str, Any]]) -> None:
    new = _parts_content(parts)
    old = turn["content"]
    if isinstance(old, str) and isinstance(new, str):
        turn["content"] = old + new
        return
    as_list = lambda c: (
        ([{"type": "text", "text": c}] if c else []) if isinstance(c, str) else list(c)
    )
    turn["content"] = as_list(old) + as_list(new)


def _input_message(item: dict[str, Any]) -> dict[str, Any]:
    return {"role": item["role"], "content": _parts_content(item["content"])}


def _result_message(item: dict[str, Any]) -> dict[str, Any]:
    output = item["output"]
    content = output if isinstance(output, str) else _parts_content(output)
    return {"role": "tool", "content": content, "tool_call_id": item["call_id"]}


def has_user_message(items: Sequence[dict[str, Any]]) -> bool:
    return any(it["type"] == "message" and it["role"] == "user" for it in items)

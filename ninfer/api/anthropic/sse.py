"""Anthropic Messages responses: the aggregate message and the SSE event stream.

Both are built from the `GenerationEvent`s of one generation (see generation.py), so the
aggregate response and the accumulation of the stream agree:

    message_start (after Admitted: usage split already exact) → ping →
    per block: content_block_start → content_block_delta* → content_block_stop
      thinking: thinking_delta*, then signature_delta just before the block closes
      text:     text_delta*
      tool_use: input_json_delta* (partial_json pieces concatenate to the input JSON)
    → message_delta (stop_reason, stop_sequence, cumulative usage) → message_stop

A failure after the stream started is an `error` event instead of message_delta/message_stop.
Stop reasons: a matched stop string -> "stop_sequence" (with the string), EOS -> "end_turn",
tool calls -> "tool_use", the output cap -> "max_tokens", the context ceiling ->
"model_context_window_exceeded". Usage: `input_tokens` counts uncached prompt tokens,
`cache_read_input_tokens` the reused ones, `cache_creation_input_tokens` is null (unknown).
Thinking blocks carry an opaque signature derived from their text; signatures are ignored on
input, so retained history stays valid across restarts. Tool-use ids are the engine's call ids
with the `toolu_` prefix.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from ninfer.api.service.generation import (
    Admitted,
    ContentText,
    Finished,
    GenerationEvent,
    PromptProgress,
    ReasoningText,
    ToolCallArgs,
    ToolCallDone,
    ToolCallStart,
)
from ninfer.api.wire.anthropic_errors import anthropic_stream_error, generation_failure
from ninfer.api.wire.errors import ApiError

KEEP_ALIVE = ": keep-alive\n\n"
KEEP_ALIVE_S = 5.0


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def tool_use_id(call_id: str) -> str:
    """The Anthropic spelling of an engine tool-call id (`call_x` -> `toolu_x`)."""
    if call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_")


def thinking_signature(thinking: str) -> str:
    """An opaque, deterministic compatibility signature for a visible thinking block."""
    return "ninfer1." + hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def stop_reason(finished: Finished) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished generation (not error/cancelled)."""
    if finished.stop_sequence is not None:
        return "stop_sequence", finished.stop_sequence
    if finished.reason == "tool_calls":
        return "tool_use", None
    if finished.reason == "length":
        if finished.length_cause == "context":
            return "model_context_window_exceeded", None
        return "max_tokens", None
    return "end_turn", None


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:  # the parser always emits an object; keep the text if not
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def aggregate_message(finished: Finished, *, message_id: str, model: str) -> dict[str, Any]:
    """The non-streaming Messages response for a generation that ended normally."""
    content: list[dict[str, Any]] = []
    if finished.reasoning:
        content.append(
            {
                "type": "thinking",
                "thinking": finished.reasoning,
                "signature": thinking_signature(finished.reasoning),
            }
        )
    if finished.content:
        content.append({"type": "text", "text": finished.content})
    for call in finished.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.id),
                "name": call.name,
                "input": _tool_input(call.arguments),
            }
        )
    reason, sequence = stop_reason(finished)
    u = finished.usage
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens),
    }


def sse_frame(event: str, data: dict[str, Any]) -> str:
    """One SSE event: `event:` name and a single-line JSON `data:`."""
    return (
        f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"
    )


class MessageStreamWriter:
    """Serialises one generation's events as Anthropic SSE frames (strings).

    Call `feed(event)` for every event in order; it returns the frames to send (possibly none).
    `Admitted` produces message_start and a ping; `Finished` closes the open block and ends
    the message (or reports the error). `error(err)` reports a failure raised instead of events.
    """

    def __init__(self, *, message_id: str, model: str, pending_timeout_ms: int = 0) -> None:
        self.message_id = message_id
        self.model = model
        self.pending_timeout_ms = pending_timeout_ms  # for a queue-timeout failure's message
        self.started = False
        self.ended = False
        self._index = -1  # index of the last opened block
        self._open: str | None = None  # "thinking" | "text" | "tool_use"
        self._thinking: list[str] = []
        self._tool_index: int | None = None  # generation tool-call index of the open tool block

    def feed(self, event: GenerationEvent) -> list[str]:
        if isinstance(event, Admitted):
            return self._start(event)
        if isinstance(event, PromptProgress):
            return []
        if isinstance(event, ReasoningText):
            return self._delta(
                "thinking", {"type": "thinking_delta", "thinking": event.text}, event.text
            )
        if isinstance(event, ContentText):
            return self._delta("text", {"type": "text_delta", "text": event.text}, event.text)
        if isinstance(event, ToolCallStart):
            out = self._close()
            out += self._open_block(
                "tool_use",
                {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name, "input": {}},
            )
            self._tool_index = event.index
            return out
        if isinstance(event, ToolCallArgs):
            if self._open != "tool_use" or event.text == "":
                return []
            return [self._block_delta({"type": "input_json_delta", "partial_json": event.text})]
        if isinstance(event, ToolCallDone):
            return self._close() if self._open == "tool_use" else []
        if isinstance(event, Finished):
            return self._finish(event)
        raise TypeError(f"unknown generation event {event!r}")

    def error(self, err: ApiError) -> list[str]:
        """The frames for a failure after the response started: one `error` event, which
        ends the stream (no message_delta / message_stop follow)."""
        self.ended = True
        return [sse_frame("error", anthropic_stream_error(err))]

    # -- internals -----------------------------------------------------------------------------

    def _start(self, admitted: Admitted) -> list[str]:
        if self.started:
            return []
        self.started = True
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(admitted.prompt_tokens, admitted.cached_tokens, 0),
        }
        return [
            sse_frame("message_start", {"type": "message_start", "message": message}),
            sse_frame("ping", {"type": "ping"}),
        ]

    def _delta(self, kind: str, delta: dict[str, Any], text: str) -> list[str]:
        if not text:
            return []
        out: list[str] = []
        if self._open != kind:
            out += self._close()
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            out += self._open_block(kind, block)
        if kind == "thinking":
            self._thinking.append(text)
        out.append(self._block_delta(delta))
        return out

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[str]:
        self._index += 1
        self._open = kind
        self._thinking = []
        return [
            sse_frame(
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": block},
            )
        ]

    def _block_delta(self, delta: dict[str, Any]) -> str:
        return sse_frame(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        out: list[str] = []
        if self._open == "thinking":
            signature = thinking_signature("".join(self._thinking))
            out.append(self._block_delta({"type": "signature_delta", "signature": signature}))
        out.append(
            sse_frame("content_block_stop", {"type": "content_block_stop", "index": self._index})
        )
        self._open = None
        self._tool_index = None
        return out

    def _finish(self, finished: Finished) -> list[str]:
        out = self._close()
        if finished.reason == "error":
            cause = generation_failure(finished.error, pending_timeout_ms=self.pending_timeout_ms)
            return out + self.error(cause)
        if finished.reason == "cancelled":
            self.ended = True
            return out
        if not self.started:  # defensive: Finished always follows Admitted
            u = finished.usage
            out = self._start(Admitted(u.prompt_tokens, u.cached_tokens, "root")) + out
        reason, sequence = stop_reason(finished)
        u = finished.usage
        out.append(
            sse_frame(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens),
                },
            )
        )
        out.append(sse_frame("message_stop", {"type": "message_stop"}))
        self.ended = True
        return out

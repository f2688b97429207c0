"""Responses output: GenerationEvents -> output Items and semantic SSE events.

`OutputBuilder` is the one place that turns the generation event stream into Responses output
Items, so the JSON body and the SSE stream of the same generation carry identical Items. It opens
an Item when its first delta arrives and closes it when another kind begins or the generation
finishes:

    ReasoningText  -> reasoning Item (content [reasoning_text], summary [])
    ContentText    -> assistant message Item (content [output_text])
    ToolCallStart / ToolCallArgs / ToolCallDone -> function_call Item (fc_ id, call_ id,
                      namespace and name restored from the internal engine name)

Each `feed` returns the semantic events (dicts with `type`, without `sequence_number`):

    response.output_item.added, response.content_part.added,
    response.reasoning_text.delta | response.output_text.delta | response.function_call_arguments.delta,
    matching *.done, response.content_part.done, response.output_item.done

`SseFramer` numbers events and writes `event: NAME` + `data: JSON` frames (no `[DONE]`); the
transport (`ninfer.api.server.sse.with_keepalive`) adds the `: keep-alive` comment after 5 s without a
frame. The lifecycle events (created, in_progress, the terminal event) are assembled by
`endpoints.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ninfer.api.responses.items import new_id
from ninfer.api.responses.tools import ToolSet
from ninfer.api.service.generation import (
    ContentText,
    Finished,
    GenerationEvent,
    ReasoningText,
    ToolCallArgs,
    ToolCallDone,
    ToolCallStart,
)
from ninfer.api.service.toolcalls import ToolCall

# Finished.reason -> Response status
STATUS = {
    "stop": "completed",
    "tool_calls": "completed",
    "length": "incomplete",
    "cancelled": "cancelled",
    "error": "failed",
}


class OutputBuilder:
    """Accumulates output Items from GenerationEvents (see module docstring).

    `output` holds the Items in output order; an Item's dict is final once its
    `response.output_item.done` event was returned. `make_id(prefix)` makes Item ids. `seal`,
    when given (include "reasoning.encrypted_content"), turns a closed reasoning Item's text
    into its `encrypted_content` token.
    """

    def __init__(
        self,
        tools: ToolSet,
        make_id: Callable[[str], str] = new_id,
        seal: Callable[[str], str] | None = None,
    ) -> None:
        self.tools = tools
        self._seal = seal
        self.output: list[dict[str, Any]] = []
        self._make_id = make_id
        self._open: int | None = None  # output index of the open reasoning/message Item
        self._calls: dict[int, int] = {}  # ToolCallStart.index -> output index
        self._args: dict[int, str] = {}  # output index -> arguments streamed so far
        self._text: dict[int, str] = {}  # output index -> text streamed so far
        self._logprobs: dict[int, list[dict[str, Any]]] = {}  # output index -> its entries

    # -- text Items ----------------------------------------------------------------------------

    def _open_text(self, kind: str) -> list[dict[str, Any]]:
        """Make the open Item a `kind` ("reasoning" | "message") Item, opening one if needed."""
        if self._open is not None and self.output[self._open]["type"] == kind:
            return []
        events = self._close_text("completed")
        idx = len(self.output)
        if kind == "reasoning":
            item = {
                "id": self._make_id("rs_"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "id": self._make_id("msg_"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.output.append(item)
        self._open, self._text[idx] = idx, ""
        events.append(
            {"type": "response.output_item.added", "output_index": idx, "item": _copy(item)}
        )
        events.append({
            "type": "response.content_part.added", "item_id": item["id"], "output_index": idx,
            "content_index": 0, "part": part,
        })  # fmt: skip
        return events

    def _delta(
        self, kind: str, text: str, logprobs: tuple[dict[str, Any], ...] | None = None
    ) -> list[dict[str, Any]]:
        """A text delta; `logprobs` the entries of its tokens (message text only), which may
        come without text at the end of the output (then only into an open message)."""
        open_message = self._open is not None and self.output[self._open]["type"] == "message"
        if not text and not (logprobs and open_message):
            return []
        events = self._open_text(kind)
        idx = self._open
        assert idx is not None
        self._text[idx] += text
        entries = list(logprobs or ())
        self._logprobs.setdefault(idx, []).extend(entries)
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        ev = {
            "type": name,
            "item_id": self.output[idx]["id"],
            "output_index": idx,
            "content_index": 0,
            "delta": text,
        }
        if kind == "message":
            ev["logprobs"] = _event_entries(entries)
        events.append(ev)
        return events

    def _close_text(self, status: str) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        idx, self._open = self._open, None
        item, text = self.output[idx], self._text[idx]
        base = {"item_id": item["id"], "output_index": idx, "content_index": 0}
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            done = {"type": "response.reasoning_text.done", **base, "text": text}
        else:
            entries = self._logprobs.get(idx, [])
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": entries}
            done = {
                "type": "response.output_text.done", **base, "text": text,
                "logprobs": _event_entries(entries),
            }  # fmt: skip
        item["content"] = [part]
        if item["type"] == "reasoning" and self._seal is not None:
            item["encrypted_content"] = self._seal(text)
        item["status"] = status
        return [
            done,
            {"type": "response.content_part.done", **base, "part": dict(part)},
            {"type": "response.output_item.done", "output_index": idx, "item": _copy(item)},
        ]

    # -- function calls ------------------------------------------------------------------------

    def _call_start(self, index: int, call_id: str, internal: str) -> list[dict[str, Any]]:
        events = self._close_text("completed")
        namespace, name = self.tools.public(internal)
        item: dict[str, Any] = {
            "id": self._make_id("fc_"),
            "type": "function_call",
            "call_id": call_id,
            "name": name,
        }
        if namespace is not None:
            item["namespace"] = namespace
        item.update(arguments="", status="in_progress")
        idx = len(self.output)
        self.output.append(item)
        self._calls[index], self._args[idx] = idx, ""
        events.append(
            {"type": "response.output_item.added", "output_index": idx, "item": _copy(item)}
        )
        return events

    def _call_args(self, index: int, text: str) -> list[dict[str, Any]]:
        idx = self._calls[index]
        if not text:
            return []
        self._args[idx] += text
        return [self._args_delta(idx, text)]

    def _args_delta(self, idx: int, text: str) -> dict[str, Any]:
        item = self.output[idx]
        return {
            "type": "response.function_call_arguments.delta",
            "item_id": item["id"],
            "output_index": idx,
            "delta": text,
        }

    def _call_done(self, index: int, call: ToolCall) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if index not in self._calls:  # a call seen only in its Done event
            events += self._call_start(index, call.id, call.name)
        idx = self._calls.pop(index)
        streamed = self._args.pop(idx)
        if call.arguments.startswith(streamed) and len(call.arguments) > len(streamed):
            events.append(self._args_delta(idx, call.arguments[len(streamed) :]))
        item = self.output[idx]
        item.update(arguments=call.arguments, status="completed")
        events.append({
            "type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": idx,
            "name": item["name"], "arguments": call.arguments,
        })  # fmt: skip
        events.append(
            {"type": "response.output_item.done", "output_index": idx, "item": _copy(item)}
        )
        return events

    # -- public API ----------------------------------------------------------------------------

    def feed(self, event: GenerationEvent) -> list[dict[str, Any]]:
        """Semantic events for one generation event (Admitted/PromptProgress give none;
        Finished must go to `finish`)."""
        if isinstance(event, ReasoningText):
            return self._delta("reasoning", event.text)
        if isinstance(event, ContentText):
            return self._delta("message", event.text, event.logprobs)
        if isinstance(event, ToolCallStart):
            return self._call_start(event.index, event.id, event.name)
        if isinstance(event, ToolCallArgs):
            return self._call_args(event.index, event.text)
        if isinstance(event, ToolCallDone):
            return self._call_done(event.index, event.call)
        if isinstance(event, Finished):
            raise TypeError("pass Finished to OutputBuilder.finish")
        return []

    def finish(self, fin: Finished) -> list[dict[str, Any]]:
        """Close every open Item. Text or calls that `fin` holds beyond what was streamed are
        emitted first, so the Items always equal the final values. Returns the events."""
        status = "incomplete" if STATUS.get(fin.reason) == "incomplete" else "completed"
        events: list[dict[str, Any]] = []
        for kind, final in (("reasoning", fin.reasoning), ("message", fin.content)):
            streamed = "".join(
                self._text[i] for i, it in enumerate(self.output) if it["type"] == kind
            )
            if (
                final.startswith(streamed)
                and len(final) > len(streamed)
                and not self._calls_started()
            ):
                events += self._delta(kind, final[len(streamed) :])
        events += self._close_text(status)
        seen = {it["call_id"] for it in self.output if it["type"] == "function_call"}
        for n, call in enumerate(fin.tool_calls):
            if call.id not in seen:
                events += self._call_done(-1 - n, call)
        for index in list(self._calls):  # started but never done: close with what streamed
            idx = self._calls.pop(index)
            item = self.output[idx]
            item.update(arguments=self._args.pop(idx), status="incomplete")
            events.append(
                {"type": "response.output_item.done", "output_index": idx, "item": _copy(item)}
            )
        return events

    def _calls_started(self) -> bool:
        return any(it["type"] == "function_call" for it in self.output)


def _event_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log-probability entries as the output_text delta / done events carry them: the API
    reference gives those no `bytes` (the output_text part's entries have them)."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [
                {"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]
            ],
        }
        for e in entries
    ]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(item))


class SseFramer:
    """Numbers semantic events from 0 and formats them as SSE frames whose event name equals
    the JSON `type`."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def frame(self, event: dict[str, Any]) -> bytes:
        body = {"type": event["type"], "sequence_number": self.sequence_number}
        body.update((k, v) for k, v in event.items() if k != "type")
        self.sequence_number += 1
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return f"event: {event['type']}\ndata: {data}\n\n".encode()

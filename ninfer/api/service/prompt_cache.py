"""Prompt-cache write candidates: where in the prompt's token ids the engine keeps checkpoints.

`prompt_checkpoints(...)` maps a request's semantic cache boundaries to exact token frontiers
of its already encoded prompt (docs/serving.md, "Prompt caching hints", and the Anthropic
cache_control rules):

- the end of the conversation before the generation prompt (what a follow-up turn shares);
- every explicit breakpoint (`CachePoint`) at the end of its marked part: a text or media part
  inside a message's content, an assistant tool call, or a tool definition;
- with `implicit`, the automatic candidate: the end of the last message's text, just before
  the control token that closes it (a later request whose last message grew shares it).

How a boundary is found without re-encoding the prompt:

    1. locate the boundary as a character position `cut` of the rendered text. Content and
       tool-call boundaries: render once more with a private marker character inserted at each
       marked place (end of the part; end of the tool call's name, whose call ends at the next
       control token); the marked rendering minus its markers must equal the prompt text.
       Tool definitions: the end of the tool's JSON in the text.
    2. map `cut` to a token index: control tokens split the encoding into independent pieces,
       so only the piece between the previous control token and `cut` is encoded; it must be
       a token prefix of the prompt's ids from there ("exact rendered-token frontier").

A boundary that cannot be located or is not a token frontier is ignored: hints never change the
prompt.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from typing import Any

from ninfer.api.service.generation import CachePoint, GenerationRequest
from ninfer.api.service.prompt_encoding import PromptEncoder
from ninfer.api.service.template import RenderedPrompt
from ninfer.api.wire.errors import ApiError

MAX_CACHE_WRITES = 4  # prompt-cache write candidates one request may carry
_MARK_BASE = 0x100000  # plane-16 private use: one marker character per breakpoint

Render = Callable[[list[dict[str, Any]], bool], RenderedPrompt]  # (messages, gen. prompt)


def prompt_checkpoints(
    req: GenerationRequest,
    rendered: RenderedPrompt,
    ids: Sequence[int],
    encoder: PromptEncoder,
    render: Render,
    implicit: bool = False,
) -> tuple[int, ...]:
    """Token frontiers (ascending, 0 < f < len(ids)) of the conversation end, of the request's
    explicit cache points and, with `implicit`, of the automatic candidate. `render(messages,
    add_generation_prompt)` renders like the prompt did (same tools and options); it may raise
    ApiError (the boundary is then ignored)."""
    ordered = sorted(rendered.special_spans)
    at = encoder.control_positions(ids)  # one pass over the ids for every boundary
    if len(at) != len(ordered):
        return ()
    cuts: list[int] = []
    if not req.continue_final_message and len(req.messages) >= 2:
        try:
            prefix = render(req.messages, False).text
        except ApiError:
            prefix = ""
        if prefix and rendered.text.startswith(prefix):
            cuts.append(len(prefix))
    cuts += _marked_cuts(req, rendered, render)
    cuts += _tool_cuts(req, rendered.text)
    if implicit and (cut := _content_end_cut(req, rendered.text, ordered)) is not None:
        cuts.append(cut)
    points = set()
    for cut in cuts:
        f = frontier(rendered.text, ordered, at, ids, cut, encoder)
        if f is not None and 0 < f < len(ids):
            points.add(f)
    return tuple(sorted(points))


def _content_end_cut(
    req: GenerationRequest, text: str, spans: Sequence[tuple[int, int]]
) -> int | None:
    """The character position where the last message's text ends right before a control token
    (the last such occurrence), or None when that text is empty or not found there."""
    content = req.messages[-1].get("content") if req.messages else None
    if isinstance(content, list):
        last = content[-1] if content else None
        content = last.get("text") if isinstance(last, dict) else None
    if not isinstance(content, str) or not content:
        return None
    starts = {a for a, _ in spans}
    end = len(text)
    while (i := text.rfind(content, 0, end)) >= 0:
        if i + len(content) in starts:
            return i + len(content)
        end = i + len(content) - 1
    return None


def frontier(
    text: str,
    spans: Sequence[tuple[int, int]],
    at: Sequence[int],
    ids: Sequence[int],
    cut: int,
    encoder: PromptEncoder,
) -> int | None:
    """The token index where the prompt's first `cut` characters end exactly, or None when
    `cut` falls inside a token or a control token. `spans`: sorted control-token spans of
    `text`; `at`: their positions in `ids`. Encodes only the text since the previous control
    token."""
    j = bisect.bisect_left(spans, (cut, -1))  # spans before j start before cut
    if j and spans[j - 1][1] > cut:
        return None
    begin, first = (spans[j - 1][1], at[j - 1] + 1) if j else (0, 0)
    limit = at[j] if j < len(at) else len(ids)
    piece = encoder.encode(text[begin:cut]) if cut > begin else []
    end = first + len(piece)
    if end > limit or list(ids[first:end]) != piece:
        return None
    return end


def _tool_cuts(req: GenerationRequest, text: str) -> list[int]:
    """Ends of the marked tool definitions: each tool's JSON (as the template's `tojson` writes
    it) is searched for after the previous tool's."""
    wanted = {p.tool for p in req.cache_points if p.tool is not None}
    if not wanted or not req.tools:
        return []
    cuts, pos = [], 0
    for i, tool in enumerate(req.tools[: max(wanted) + 1]):
        found = text.find(json.dumps(tool, ensure_ascii=False), pos)
        if found < 0:
            break
        pos = found + len(json.dumps(tool, ensure_ascii=False))
        if i in wanted:
            cuts.append(pos)
    return cuts


def _marked_cuts(req: GenerationRequest, rendered: RenderedPrompt, render: Render) -> list[int]:
    """Cuts of the content and tool-call points, from renderings with markers: all points in one
    rendering, or, when the template changes the text around some marker, one per point."""
    points = [p for p in req.cache_points if p.message is not None]
    if not points:
        return []
    located = _locate(req, rendered, render, points)
    if located is not None:
        return located
    if len(points) == 1:
        return []
    return [c for p in points for c in (_locate(req, rendered, render, [p]) or [])]


def _locate(
    req: GenerationRequest,
    rendered: RenderedPrompt,
    render: Render,
    points: list[CachePoint],
) -> list[int] | None:
    marks = [chr(_MARK_BASE + k) for k in range(len(points))]
    if any(m in json.dumps(req.messages, ensure_ascii=False) for m in marks):
        return None
    messages = list(req.messages)
    for mark, p in zip(marks, points):
        assert p.message is not None
        if not 0 <= p.message < len(messages):
            return None
        msg = messages[p.message] = dict(messages[p.message])
        if p.tool_call is not None:
            calls = [dict(c) for c in msg.get("tool_calls") or []]
            if not 0 <= p.tool_call < len(calls) or not isinstance(calls[p.tool_call], dict):
                return None
            fn = dict(calls[p.tool_call].get("function") or {})
            if not isinstance(fn.get("name"), str):
                return None
            fn["name"] += mark
            calls[p.tool_call]["function"] = fn
            msg["tool_calls"] = calls
        else:
            content = _insert(msg.get("content"), p.offset or 0, mark)
            if content is None:
                return None
            msg["content"] = content
    try:
        text = render(messages, not req.continue_final_message).text
    except ApiError:
        return None
    if text.translate({ord(m): None for m in marks}) != rendered.text:
        return None
    found = sorted((text.find(m), k) for k, m in enumerate(marks))
    if found[0][0] < 0:
        return None
    cuts = []
    for n, (pos, k) in enumerate(found):
        cut = pos - n  # the markers before this one are not in the prompt
        if points[k].tool_call is not None:  # the call ends with the next control token
            after = [(a, b) for a, b in rendered.special_spans if a >= cut]
            if not after:
                continue
            cut = min(after)[1]
        cuts.append(cut)
    return cuts


def _insert(content: Any, offset: int, mark: str) -> Any:
    """`content` (a string, or text/media items) with `mark` after its first `offset` units
    (see `CachePoint`); None when the content is shorter."""
    if isinstance(content, str):
        return content[:offset] + mark + content[offset:] if offset <= len(content) else None
    if not isinstance(content, list):
        return None
    items = [dict(it) if isinstance(it, dict) else it for it in content]
    left = offset
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            return None
        if it.get("type") == "text":
            text = it.get("text") or ""
            if left <= len(text):
                it["text"] = text[:left] + mark + text[left:]
                return items
            left -= len(text)
        else:
            left -= 1
            if left == 0:  # right after this media item
                items.insert(i + 1, {"type": "text", "text": mark})
                return items
    return None

"""Prompt preparation: a protocol-free `GenerationRequest` rendered, encoded and checked.

    GenerationRequest ─template─▶ prompt text ─encode─▶ ids ─media placement─▶ Prepared

`prepare_prompt` is the only place a request becomes prompt token ids: the context ceiling is
checked before the full encoding (a cheap partial count first) and again after media placement;
prefix checkpoints are found at the request's semantic cache boundaries
(ninfer.api.service.prompt_cache).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer.api.service.generation import GenerationRequest
from ninfer.api.service.media_path import MediaPath
from ninfer.api.service.media_prompt import split_media
from ninfer.api.service.prompt_cache import MAX_CACHE_WRITES, prompt_checkpoints
from ninfer.api.service.prompt_encoding import PromptEncoder
from ninfer.api.service.reasoning import prompt_starts_in_thinking
from ninfer.api.service.template import ChatTemplate, RenderedPrompt
from ninfer.api.wire.errors import ApiError
from ninfer.media.preparer import PreparedItem, request_log_fields
from ninfer.runtime.media_span import MediaSpan


@dataclass(frozen=True)
class Prepared:
    """A prepared prompt. `media`: its MediaSpans (empty without images/videos); `media_log`:
    the request's media fields for the request log (None without media)."""

    prompt_ids: list[int]
    prompt_text: str
    starts_in_thinking: bool
    checkpoint_positions: tuple[int, ...]
    media: tuple[MediaSpan, ...] = ()
    media_log: dict[str, Any] | None = None


def screen_prompt(
    req: GenerationRequest, *, template: ChatTemplate, encoder: PromptEncoder, max_context: int
) -> None:
    """What `prepare_prompt` checks of a request without media before encoding it whole:
    raises the same ApiError (invalid_prompt from the template, context_length_exceeded from a
    partial count); ValueError when the request has media. Returning says nothing about the
    rest (the prompt may still be over the context once encoded)."""
    _render_counted(req, 0, template, encoder, max_context)


def _param(req: GenerationRequest) -> str:
    return "input" if req.protocol == "responses" else "messages"  # the conversation's field


def _render_counted(
    req: GenerationRequest,
    media_count: int,
    template: ChatTemplate,
    encoder: PromptEncoder,
    max_context: int,
) -> tuple[GenerationRequest, RenderedPrompt, Callable[..., RenderedPrompt]]:
    """`req` without its media sources, its rendered prompt and the render function (for
    checkpoints), after a partial count that refuses a prompt over `max_context`."""
    param = _param(req)
    messages, inputs = split_media(req.messages, param)
    if len(inputs) != media_count:
        raise ValueError(f"{len(inputs)} media items in the prompt, {media_count} prepared")
    if inputs:  # the template sees the items' types, not their sources
        req = dataclasses.replace(req, messages=messages)

    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> RenderedPrompt:
        return template.render(
            messages,
            tools=req.tools,
            add_generation_prompt=generation_prompt,
            continue_final_message=req.continue_final_message,
            options=req.template_options,
        )

    rendered = render(req.messages, not req.continue_final_message)
    # a long prompt is counted chunk by chunk first: one tokenizer call on megabytes holds
    # the GIL (and so the event loop) for seconds, to find what a partial count shows
    at_least = encoder.count_at_least(rendered.text, rendered.special_spans, stop_at=max_context)
    if at_least >= max_context:
        raise ApiError(
            400,
            f"the prompt has at least {at_least} tokens but the context ceiling is"
            f" {max_context} (--max-context, or the KV pool of --kv-capacity when"
            " smaller), leaving no room for output",
            code="context_length_exceeded",
            param=param,
        )
    return req, rendered, render


def prepare_prompt(
    req: GenerationRequest,
    media: Sequence[PreparedItem],
    *,
    template: ChatTemplate,
    encoder: PromptEncoder,
    max_context: int,
    media_path: MediaPath | None,
) -> Prepared:
    """Render and encode `req`'s prompt with `media` (its images and videos, prepared in prompt
    order) placed in it. Raises ApiError (invalid_prompt, context_length_exceeded,
    media_budget_exceeded) when it cannot be served; ValueError when `media` does not match the
    request's media parts (a caller's bug)."""
    req, rendered, render = _render_counted(req, len(media), template, encoder, max_context)
    param = _param(req)
    text_ids = encoder.encode(rendered.text, rendered.special_spans)
    if not text_ids:
        raise ApiError(400, "the rendered prompt is empty", code="invalid_prompt", param=param)
    place = media_path.place if media_path is not None and media else None
    expansion = place(text_ids, media, encoder.encode_text, param) if place else None
    ids = expansion.ids if expansion is not None else text_ids
    if len(ids) >= max_context:
        raise ApiError(
            400,
            f"the prompt has {len(ids)} tokens but the context ceiling is {max_context}"
            " (--max-context, or the KV pool of --kv-capacity when smaller), leaving no room"
            " for output",
            code="context_length_exceeded",
            param=param,
        )
    # prefix checkpoints at semantic boundaries: the end of the conversation before the
    # generation prompt, the end of each part a cache hint marks and, when a write slot is
    # left, the implicit candidate; a boundary counts only at an exact token frontier
    implicit = req.implicit_cache_point and len(req.cache_points) < MAX_CACHE_WRITES
    checkpoints = prompt_checkpoints(req, rendered, text_ids, encoder, render, implicit)
    starts = prompt_starts_in_thinking(rendered.text, rendered.special_spans)
    if expansion is None:
        return Prepared(text_ids, rendered.text, starts, checkpoints)
    checkpoints = tuple(expansion.position(p) for p in checkpoints)
    log = dict(request_log_fields([m.stats for m in media]), vision_tokens=expansion.vision_tokens)
    return Prepared(ids, rendered.text, starts, checkpoints, expansion.spans, log)

"""The engine with media: pauses under KV pressure (replay re-encodes the media, snapshots keep
the computed state) give the tokens of an undisturbed run; prefix reuse tells images apart by
their digest; an engine without a vision tower refuses media."""

from __future__ import annotations

import dataclasses
import functools
import time

import pytest
from media_prompts import PromptBuilder, png

from ninfer import LLM
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.cpu.executor import executor_for
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, RequestError, SamplingParams

ARCH = "qwen3_5_vl"
PAGE = 16
T = 120.0


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def image_request(builder: PromptBuilder, seed: int, text: str, n: int, **kw) -> Request:
    p = builder.text(text).image(png(40, 56, seed=seed)).text(" Say more.").build()
    return Request(tuple(p.ids), greedy(n), media=p.spans, **kw)


@functools.cache
def _alone_llm(path: str) -> LLM:
    return LLM(path, vision=True, cpu_weights="float32", max_concurrency=1, kv_capacity=512)


def alone(path: str, request: Request) -> tuple[int, ...]:
    """The request's tokens on an engine of its own (no pressure, no pause, no reuse)."""
    fresh = dataclasses.replace(request, checkpoint_positions=(), session_key=None)
    out = _alone_llm(path).engine.submit(fresh).result(T)
    assert out.error is None
    return out.token_ids


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_paused_media_requests_resume_to_their_solo_tokens(route, vision_artifact, prompt_builder):
    path = str(vision_artifact(ARCH))
    requests = [
        image_request(prompt_builder(ARCH), seed=10 + i, text=text, n=n)
        for i, (text, n) in enumerate(
            [("Hello, look here: ", 30), ("The weather today ", 24), ("Numbers: 1 2 3 ", 28)]
        )
    ]
    ex = executor_for(
        path, vision=True, cpu_weights="float32", max_concurrency=3, kv_capacity=5 * PAGE,
        max_context=256, page_size=PAGE,
    )  # fmt: skip
    config = EngineOptions.of(
        vision=True, cpu_weights="float32", max_concurrency=3, max_context=256,
        kv_capacity=5 * PAGE, page_size=PAGE, prefill_chunk=16, prefix_reuse=False,
        host_context_mib=0 if route == "replay" else None,
    )  # fmt: skip
    with Engine(config, ex, Sampler(), eos_ids=(), plan=ex.plan) as engine:
        outs = [h.result(T) for h in [engine.submit(r) for r in requests]]
        deadline = time.monotonic() + T
        while (stats := engine.snapshot()).running + stats.waiting + stats.paused:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    for r, out in zip(requests, outs):
        assert out.error is None
        assert out.token_ids == alone(path, r)
    assert stats.preemptions_total > 0
    if route == "replay":
        assert stats.replay_restores_total > 0 and stats.replayed_tokens_total > 0
    else:
        assert stats.snapshot_restores_total > 0


def test_prefix_reuse_keys_media_by_digest(vision_artifact, prompt_builder):
    """The same prompt and image again reuses the prefix; the same placeholders with another
    image (same size, so the same ids) reuse nothing from the image on."""
    path = str(vision_artifact(ARCH))
    llm = LLM(path, vision=True, cpu_weights="float32", max_concurrency=1, kv_capacity=512,
              page_size=PAGE)  # fmt: skip
    first = image_request(prompt_builder(ARCH), 1, "A picture of my cat, taken today: ", 6)
    mark = (len(first.prompt_token_ids),)
    first = dataclasses.replace(first, checkpoint_positions=mark)
    other = image_request(prompt_builder(ARCH), 2, "A picture of my cat, taken today: ", 6)
    other = dataclasses.replace(other, checkpoint_positions=mark)
    assert other.prompt_token_ids == first.prompt_token_ids
    offset = first.media[0].offset
    a = llm.engine.submit(first).result(T)
    again = llm.engine.submit(first).result(T)
    b = llm.engine.submit(other).result(T)
    assert again.usage.cached_tokens > offset  # past the image
    assert again.token_ids == a.token_ids
    assert b.usage.cached_tokens <= offset
    assert b.token_ids == alone(path, other) != a.token_ids


def test_an_engine_without_the_vision_tower_refuses_media(vision_artifact, prompt_builder):
    path = str(vision_artifact(ARCH))
    llm = LLM(path, cpu_weights="float32", max_concurrency=1, kv_capacity=256)
    request = image_request(prompt_builder(ARCH), 1, "Look: ", 2)
    with pytest.raises(RequestError, match="no vision tower"):
        llm.engine.submit(request)
    with pytest.raises(RequestError, match="no vision tower"):
        llm.logits(request.prompt_token_ids, request.media)
    # the text part of the same artifact still serves
    assert len(llm.generate([[10, 20, 30]], greedy(2))[0].token_ids) == 2


def test_a_span_over_other_tokens_is_the_callers_error(vision_artifact, prompt_builder):
    """Spans must sit on their modality's placeholders: refused at submission (HTTP 400 for the
    protocol layer), never a failed step."""
    llm = _alone_llm(str(vision_artifact(ARCH)))
    request = image_request(prompt_builder(ARCH), 1, "Look: ", 2)
    (span,) = request.media
    shifted = dataclasses.replace(span, offset=span.offset - 1)  # starts on <|vision_start|>
    with pytest.raises(RequestError, match="covers token .* not its placeholder"):
        llm.engine.submit(dataclasses.replace(request, media=(shifted,)))
    video = dataclasses.replace(span, modality="video")  # image pads are not video pads
    with pytest.raises(RequestError, match="not its placeholder"):
        llm.logits(request.prompt_token_ids, (video,))

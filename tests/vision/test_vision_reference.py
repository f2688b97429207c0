"""The vision tower and MRoPE against transformers' Qwen3.5 conditional-generation models, on
the tiny random vision fixtures, CPU float32: logits of prompts with an image, a short video
and both within 1e-3, and greedy continuations token for token, through ninfer's engine with
`Request.media` (placeholders and patch rows from ninfer.media's preprocessing of a PNG made
with pillow and an MP4 made with PyAV)."""

from __future__ import annotations

import functools

import pytest
import torch
from media_prompts import MediaPrompt, PromptBuilder, mp4, png

from ninfer import LLM
from ninfer.runtime.request import Request, SamplingParams

ARCHS = ("qwen3_5_vl", "qwen3_5_moe_vl")
# video: one span with frame_offsets; frames: one span per temporal patch (the protocol layer's)
KINDS = ("image", "video", "image+video", "frames")
NEW_TOKENS = 8


def media_prompt(builder: PromptBuilder, kind: str) -> MediaPrompt:
    builder.text("Look: ")
    if "image" in kind:
        builder.image(png(40, 56, seed=1)).text(" and ")  # resized to 32 x 64: a 2 x 4 token grid
    if "video" in kind or kind == "frames":  # 2 temporal patches of 2 x 3 tokens
        builder.video(mp4(8, 48, 32, fps=4, seed=2), per_frame=kind == "frames")
    return builder.text(" What is it?").build()


@functools.cache
def _llm(path: str, prefill_chunk: int = 1024) -> LLM:
    return LLM(
        path, vision=True, cpu_weights="float32", max_concurrency=2, kv_capacity=1024,
        prefill_chunk=prefill_chunk,
    )  # fmt: skip


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def reference_greedy(model, prompt: MediaPrompt, n: int) -> list[int]:
    """n greedy tokens of the transformers model: one prefill with the media, then one token at
    a time from its cache, positions continuing by its rope_deltas (no EOS stop)."""
    out: list[int] = []
    model.model.rope_deltas = None  # left by an earlier call
    with torch.no_grad():
        step = model(**prompt.reference_inputs(), use_cache=True)
        for _ in range(n):
            out.append(int(step.logits[0, -1].argmax()))
            step = model(input_ids=torch.tensor([[out[-1]]]), cache=step.cache, use_cache=True)
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logits_match_transformers(
    arch, kind, vision_artifact, reference_model, prompt_builder
):
    prompt = media_prompt(prompt_builder(arch), kind)
    ours = _llm(str(vision_artifact(arch))).logits(prompt.ids, prompt.spans)
    with torch.no_grad():
        ref = reference_model(arch)(**prompt.reference_inputs()).logits[0]
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-3


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_continuation_matches_transformers(
    arch, kind, vision_artifact, reference_model, prompt_builder
):
    prompt = media_prompt(prompt_builder(arch), kind)
    llm = _llm(str(vision_artifact(arch)))
    request = Request(tuple(prompt.ids), greedy(NEW_TOKENS), media=prompt.spans)
    ours = llm.engine.submit(request).result(120)
    assert ours.error is None and ours.finish_reason == "length"
    assert list(ours.token_ids) == reference_greedy(reference_model(arch), prompt, NEW_TOKENS)


@pytest.mark.parametrize("arch", ARCHS[:1])
def test_prefill_chunks_that_cut_through_media_give_the_same_tokens(
    arch, vision_artifact, reference_model, prompt_builder
):
    """Chunks of 5 tokens start and end inside the image (8 placeholders) and the video's frame
    runs (6 each): each item is still encoded once and its rows land where they belong."""
    prompt = media_prompt(prompt_builder(arch), "image+video")
    llm = _llm(str(vision_artifact(arch)), prefill_chunk=5)
    media = llm.executor.media
    before = media.encoded_items
    request = Request(tuple(prompt.ids), greedy(NEW_TOKENS), media=prompt.spans)
    out = llm.engine.submit(request).result(120)
    assert out.error is None
    assert media.encoded_items - before == 2  # the image and the video, once each
    assert list(out.token_ids) == reference_greedy(reference_model(arch), prompt, NEW_TOKENS)

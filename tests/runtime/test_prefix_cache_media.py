"""Prefix reuse of multimodal prompts: a page that overlaps an image is reused only for the same
image (digest) at the same grid; pages before the image are shared whatever it is.

The engine runs with the fake executor (the reuse decision is torch-free; the vision tower is the
subject of the executor's own tests), under a plan that declares a vision tower whose image
placeholder is PAD (the engine admits media only then): what is checked is what the engine
reports as reused.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from fake_executor import FakeExecutor

from ninfer.ir.plan_sections import VisionLayout
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.prefix_cache import page_key
from ninfer.runtime.request import Request, SamplingParams

VOCAB, EOS, PAD = 32, (0,), 7
PAGE = 4
T = 20.0


def make_engine(hybrid: bool = False) -> Engine:
    config = EngineOptions.of(page_size=PAGE, max_context=128, max_concurrency=2)
    slots = config.num_state_slots if hybrid else 0
    ex = FakeExecutor(
        config.num_pages, config.page_size, VOCAB, is_hybrid=hybrid, num_state_slots=slots
    )
    tower = VisionLayout(
        blocks=1, hidden=8, heads=1, patch_size=2, temporal_patch_size=2, merge_size=2,
        in_channels=3, out_hidden=8, grid_side=2, image_token_id=PAD, video_token_id=PAD + 1,
    )  # fmt: skip
    return Engine(config, ex, Sampler(), EOS, plan=SimpleNamespace(vision=tower))


def digest(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


# 5 text tokens, an image of 6 placeholders at 5..10, then text: pages [0..3] [4..7] [8..11] ...
PROMPT = (3, 4, 5, 6, 8) + (PAD,) * 6 + (9, 10, 11, 12, 13, 14, 15, 16, 17, 18)


def request(image: str, grid: tuple[int, int, int] = (1, 4, 6)) -> Request:
    span = MediaSpan(5, 6, grid, digest(image), "image", prepared=None)
    return Request(PROMPT, SamplingParams(max_tokens=2, temperature=0.0), media=(span,))


def cached(engine: Engine, req: Request) -> int:
    return engine.submit(req).result(T).usage.cached_tokens


def test_the_same_image_reuses_the_whole_prefix_and_another_image_only_the_text_before_it():
    with make_engine() as engine:
        assert cached(engine, request("cat")) == 0
        full = (len(PROMPT) - 1) // PAGE * PAGE  # every full page but the last token's
        assert cached(engine, request("cat")) == full
        # another image: page 0 (tokens 0..3) is before it; page 1 (4..7) holds its first
        # placeholders, and its KV came from the cat
        assert cached(engine, request("dog")) == PAGE
        # the same bytes at another grid (other resize settings) are other pixels too
        assert cached(engine, request("cat", grid=(1, 6, 4))) == PAGE
        # each of them is now cached in its own right
        assert cached(engine, request("dog")) == full
        assert cached(engine, request("cat", grid=(1, 6, 4))) == full


def test_a_prompt_without_the_image_does_not_reuse_its_placeholder_pages():
    with make_engine() as engine:
        cached(engine, request("cat"))
        text_only = Request(PROMPT, SamplingParams(max_tokens=2, temperature=0.0))
        assert cached(engine, text_only) == PAGE


def test_hybrid_models_key_their_checkpointed_pages_the_same_way():
    with make_engine(hybrid=True) as engine:
        cached(engine, request("cat"))
        assert cached(engine, request("dog")) <= PAGE
        assert cached(engine, request("cat")) > PAGE


def test_page_keys_name_the_spans_they_overlap():
    span = MediaSpan(5, 6, (1, 4, 6), digest("cat"), "image", prepared=None)
    assert page_key(PROMPT, (span,), 0, PAGE) == PROMPT[0:4]  # before the image
    assert page_key(PROMPT, (span,), 1, PAGE) == PROMPT[4:8] + ((1, digest("cat"), (1, 4, 6)),)
    assert page_key(PROMPT, (span,), 2, PAGE) == PROMPT[8:12] + ((-3, digest("cat"), (1, 4, 6)),)
    assert page_key(PROMPT, (span,), 3, PAGE) == PROMPT[12:16]  # after it: the path says

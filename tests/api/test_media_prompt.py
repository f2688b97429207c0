"""Placing media in a prompt (ninfer.api.service.media_prompt through ModelService.prepare), with the
real template, the fixture tokenizer plus Qwen's vision tokens, and real prepared media.

The protocol-level tests (tests/media/test_protocol_media.py) cover the three wire formats;
these cover the prompt rules: the expanded prompt is what --max-context and the Vision
envelope judge, a template that loses an item is refused, a pad spelled in text stays text,
checkpoints land on the same boundaries after expansion, and --vision needs the tokens.
"""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from artifacts.fixtures import TEMPLATE
from artifacts.tokenizer import build_tokenizer
from ninfer.api.service.generation import CachePoint, GenerationRequest
from ninfer.api.service.media_path import MediaPath, release
from ninfer.api.service.media_prompt import MAX_VISION_TOKENS, VisionTokens, split_media
from ninfer.api.service.model_service import ModelService
from ninfer.api.service.template import chat_template_for
from ninfer.api.wire.errors import ApiError
from ninfer.errors import ConfigError
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.preparer import MediaPreparer
from tests.media.vision_server import vision_tokenizer

TOK = vision_tokenizer()
IMAGE_PAD = TOK.token_to_id("<|image_pad|>")


def png(width: int, height: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def service(
    max_context: int = 4096,
    template: str | None = None,
    config: VisionPreprocessConfig | None = None,
) -> ModelService:
    preparer = MediaPreparer.create(
        config or VisionPreprocessConfig(dtype="float32"), cache_mib=64, live_mib=256, threads=1
    )
    return ModelService(
        engine=None,
        tokenizer=TOK,
        template=chat_template_for(template or TEMPLATE.read_text(encoding="utf-8"), TOK),
        eos_ids=(TOK.token_to_id("<|im_end|>"),),
        max_context=max_context,
        media=MediaPath(preparer, VisionTokens.resolve(TOK, {})),
    )


def user(*content: Any) -> GenerationRequest:
    items = [
        {"type": "text", "text": c} if isinstance(c, str) else c for c in content
    ]  # fmt: skip
    return GenerationRequest(messages=[{"role": "user", "content": items}])


def image(uri: str, param: str = "messages[0].content[1]") -> dict[str, Any]:
    return {"type": "image", "url": uri, "param": param}


def prepare(svc: ModelService, req: GenerationRequest) -> Any:
    items = asyncio.run(svc.prepare_media(req))
    try:
        return svc.prepare(req, items)
    finally:
        release(items)


def refused(svc: ModelService, req: GenerationRequest) -> ApiError:
    with pytest.raises(ApiError) as info:
        prepare(svc, req)
    return info.value


def test_split_media_takes_the_sources_out_in_order() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [image("data:a"), {"type": "text", "text": "x"}]},
        {"role": "tool", "content": [{"type": "video", "url": "http://v/b.mp4"}]},
    ]
    out, found = split_media(msgs, "input")
    assert [(m.url, m.modality, m.param) for m in found] == [
        ("data:a", "image", "messages[0].content[1]"),
        ("http://v/b.mp4", "video", "input"),  # no field recorded: the conversation's
    ]
    assert out[0] is msgs[0]
    assert out[1]["content"] == [{"type": "image"}, {"type": "text", "text": "x"}]
    assert out[2]["content"] == [{"type": "video"}]


def test_the_expanded_prompt_is_what_the_context_ceiling_judges() -> None:
    req = user("Describe it.", image(png(64, 64)))
    full = prepare(service(), req)
    (span,) = full.media
    assert span.tokens == 64  # 256x256 (the minimum area) / 16-pixel patches / 2x2 merge
    assert len(full.prompt_ids) > span.tokens
    text_only = prepare(service(), user("Describe it."))
    # the text alone fits a ceiling that the image does not
    ceiling = len(text_only.prompt_ids) + 8
    err = refused(service(max_context=ceiling), req)
    assert (err.status, err.code) == (400, "context_length_exceeded")
    assert f"{len(full.prompt_ids)} tokens" in err.message and str(ceiling) in err.message


def test_more_vision_tokens_than_the_envelope_are_media_budget_exceeded() -> None:
    # 2-pixel patches make a 512x512 image 16,384 merged tokens without a large payload
    small_patches = VisionPreprocessConfig(patch_size=2, dtype="float32")
    uri = png(512, 512)
    svc = service(max_context=1 << 20, config=small_patches)
    two = prepare(svc, user("a", image(uri), image(uri)))
    assert sum(s.tokens for s in two.media) == 2 * 16384 == MAX_VISION_TOKENS
    err = refused(svc, user("a", image(uri), image(uri), image(uri)))
    assert (err.status, err.code, err.param) == (400, "media_budget_exceeded", "messages")
    assert "49152" in err.message and str(MAX_VISION_TOKENS) in err.message


def test_a_template_that_drops_an_image_is_refused() -> None:
    text_only = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
        "{%- for p in m.content if p.type == 'text' -%}{{ p.text }}{%- endfor -%}"
        "<|im_end|>\n{%- endfor -%}<|im_start|>assistant\n"
    )
    err = refused(service(template=text_only), user("look", image(png(32, 32))))
    assert (err.status, err.code) == (400, "invalid_prompt")
    assert "0 image(s)" in err.message and "1 image(s)" in err.message


def test_a_pad_spelled_in_text_stays_text() -> None:
    req = user("my <|image_pad|> token", image(png(32, 32)))
    prepared = prepare(service(), req)
    (span,) = prepared.media
    assert prepared.prompt_ids.count(IMAGE_PAD) == span.tokens  # only the image's own pads
    assert "<|image_pad|>" in TOK.decode(prepared.prompt_ids[: span.offset])


def test_checkpoints_keep_their_boundaries_after_expansion() -> None:
    # a breakpoint at the end of the text after the image, and the conversation's end
    req = GenerationRequest(
        messages=[
            {"role": "user", "content": [image(png(48, 48), "p"), {"type": "text", "text": "Q"}]}
        ],
        cache_points=(CachePoint(message=0, offset=2),),
    )
    prepared = prepare(service(), req)
    (span,) = prepared.media
    ids = prepared.prompt_ids
    assert prepared.checkpoint_positions
    for p in prepared.checkpoint_positions:
        assert p > span.end  # after the whole run, never inside it
        assert TOK.decode(ids[:p], skip_special_tokens=False).endswith(("Q", "<|im_end|>\n"))


def test_vision_needs_the_tokens_in_the_tokenizer_and_a_consistent_config() -> None:
    with pytest.raises(ConfigError) as e:
        VisionTokens.resolve(build_tokenizer(), {})
    assert "<|vision_start|>" in str(e.value) and "\n" not in str(e.value)
    start = TOK.token_to_id("<|vision_start|>")
    assert VisionTokens.resolve(TOK, {"vision_start_token_id": start}).vision_start == start
    with pytest.raises(ConfigError) as e:
        VisionTokens.resolve(TOK, {"text_config": {"image_token_id": 3}})
    assert "image_token_id" in str(e.value)

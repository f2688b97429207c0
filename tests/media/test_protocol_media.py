"""Images and videos through the three protocols, with the official openai and anthropic clients,
on a real --vision server (tests/media/vision_server.py says what it runs).

- The same image gives the same prompt through Chat Completions, Responses and Anthropic
  Messages: the Request the engine receives (ids and MediaSpans) and the token-count endpoints.
- The placeholder layout is Qwen3-VL's: vision_start, `tokens` image pads, vision_end; a video
  is one "<t seconds>" + framed run per temporal patch, one span each.
- The same image sent twice is prepared once (the metrics count one build and one hit), and
  the repeated prompt reuses its prefix through the image; another image does not.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from ninfer.runtime.request import Request
from tests.media.test_video import make_video
from tests.media.vision_server import build_vision_artifact, vision_server, vision_tokenizer

TOK = vision_tokenizer()
START, END, IMAGE_PAD, VIDEO_PAD = (
    TOK.token_to_id(t)
    for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
)


def png(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def data_uri(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def artifact(fixture_root: Path) -> Path:
    return build_vision_artifact(fixture_root)


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("log") / "requests.jsonl"


@pytest.fixture(scope="module")
def server(artifact: Path, log_path: Path) -> Iterator[tuple[Any, Any, list[Request]]]:
    """(base URL, state, requests the engine received): a spy on the real engine's submit."""
    with vision_server(artifact, request_log=log_path) as (client, state):
        seen: list[Request] = []
        submit = state.engine.submit

        def spy(request: Request) -> Any:
            seen.append(request)
            return submit(request)

        state.engine.submit = spy
        yield client, state, seen


def text_part(text: str) -> dict[str, Any]:
    """A Chat Completions text content part."""
    return {"type": "text", "text": text}


def image_part(url: str) -> dict[str, Any]:
    """A Chat Completions image_url content part."""
    return {"type": "image_url", "image_url": {"url": url}}


def chat_user(*parts: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions user message of `parts`."""
    return {"role": "user", "content": list(parts)}


def clients(base: str) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    oa = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    an = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    return oa, an


def test_an_image_gives_the_same_prompt_through_the_three_protocols(server: Any) -> None:
    client, _, seen = server
    oa, an = clients(client)
    image = png(64, 48)
    uri = data_uri(image)
    seen.clear()
    oa.chat.completions.create(
        model="tiny-vision-text",
        messages=[chat_user(text_part("What is this?"), image_part(uri))],
        max_completion_tokens=1,
        reasoning_effort="none",
    )
    responses_input: Any = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": uri, "detail": "auto"},
            ],
        }
    ]
    oa.responses.create(
        model="tiny-vision-text",
        input=responses_input,
        max_output_tokens=16,
        reasoning={"effort": "none"},
    )
    counted_responses = oa.responses.input_tokens.count(
        model="tiny-vision-text", input=responses_input, reasoning={"effort": "none"}
    )
    anthropic_messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": base64.b64encode(image).decode(),
                    },
                },
            ],
        }
    ]
    an.messages.create(
        model="any", max_tokens=1, messages=anthropic_messages, thinking={"type": "disabled"}
    )
    counted_anthropic = an.messages.count_tokens(
        model="any", messages=anthropic_messages, thinking={"type": "disabled"}
    )
    tokenized = httpx.post(
        server[0] + "/tokenize",
        json={
            "messages": [chat_user(text_part("What is this?"), image_part(uri))],
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ).json()
    chat, responses, messages = seen
    assert chat.prompt_token_ids == responses.prompt_token_ids == messages.prompt_token_ids
    assert tuple(tokenized["tokens"]) == chat.prompt_token_ids
    assert counted_responses.input_tokens == counted_anthropic.input_tokens
    assert counted_anthropic.input_tokens == len(chat.prompt_token_ids)
    # one image, resized within the fixture processor's budget, in 8-pixel patches merged 2x2:
    # the span covers exactly the image pads, framed by start / end
    (span,) = chat.media
    assert chat.media == responses.media == messages.media
    ids = chat.prompt_token_ids
    assert ids[span.offset - 1] == START and ids[span.end] == END
    assert ids[span.offset : span.end] == (IMAGE_PAD,) * span.tokens
    assert ids.count(IMAGE_PAD) == span.tokens
    t, h, w = span.grid_thw
    assert t == 1 and span.tokens == h * w // 4 and span.modality == "image"
    assert span.digest == hashlib.sha256(image).digest()
    assert span.prepared.pixel_values.shape == (h * w, 3 * 2 * 8 * 8)  # C x frames x patch^2


def metric(client: Any, name: str, **labels: str) -> float:
    text = httpx.get(client + "/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def test_the_same_image_sent_twice_is_prepared_once(server: Any) -> None:
    client, _, seen = server
    oa, _ = clients(client)
    uri = data_uri(png(40, 40, seed=5))
    builds = metric(client, "ninfer_media_preprocess_tasks_total")
    misses = metric(client, "ninfer_media_cache_lookups_total", result="miss")
    hits = metric(client, "ninfer_media_cache_lookups_total", result="hit")
    seen.clear()

    def send(image: str) -> Any:
        return oa.chat.completions.create(
            model="tiny-vision-text",
            messages=[
                chat_user(
                    image_part(image),
                    text_part(
                        "Describe this picture: its colours, shapes, "
                        "and anything written in it, in a few plain words."
                    ),
                )
            ],
            max_completion_tokens=1,
        )

    first_usage, second_usage = send(uri).usage, send(uri).usage
    assert metric(client, "ninfer_media_preprocess_tasks_total") == builds + 1
    assert metric(client, "ninfer_media_cache_lookups_total", result="miss") == misses + 1
    assert metric(client, "ninfer_media_cache_lookups_total", result="hit") == hits + 1
    first, second = seen
    # the second prompt reads the very payload the first one prepared
    assert first.media[0].prepared is second.media[0].prepared
    assert metric(client, "ninfer_media_vision_tokens_total") >= 2 * first.media[0].tokens
    # the repeated prompt reuses its prefix through the image's pages; another image with the
    # same placeholders reuses only what comes before it
    span = first.media[0]
    assert first_usage.prompt_tokens_details.cached_tokens == 0
    # (the hybrid model reuses at the conversation's checkpoint, a page boundary after the image)
    assert second_usage.prompt_tokens_details.cached_tokens > span.offset
    other = send(data_uri(png(40, 40, seed=6))).usage
    assert other.prompt_tokens == first_usage.prompt_tokens
    assert other.prompt_tokens_details.cached_tokens <= span.offset


def test_a_video_is_one_framed_run_per_temporal_patch(server: Any) -> None:
    client, _, seen = server
    oa, _ = clients(client)
    video = make_video(8, 64, 64, fps=4)
    seen.clear()
    oa.chat.completions.create(
        model="tiny-vision-text",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": data_uri(video, "video/mp4")}},
                    {"type": "text", "text": "What happens?"},
                ],
            }
        ],
        max_completion_tokens=1,
    )
    (request,) = seen
    spans = request.media
    assert len(spans) >= 2 and all(s.modality == "video" for s in spans)
    ids = request.prompt_token_ids
    text = TOK.decode(list(ids), skip_special_tokens=False)
    for span in spans:
        assert span.grid_thw[0] == 1 and len(span.timestamps) == 1
        assert ids[span.offset - 1] == START and ids[span.end] == END
        assert ids[span.offset : span.end] == (VIDEO_PAD,) * span.tokens
        assert f"<{span.timestamps[0]:.1f} seconds><|vision_start|>" in text
    # the template's own frame around the whole video, as transformers' processor leaves it
    assert text.count("<|vision_start|>") == len(spans) + 1
    assert len({s.digest for s in spans}) == len(spans)
    stamps = [s.timestamps[0] for s in spans]
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]


def test_the_request_log_records_each_request_s_own_media(server: Any, log_path: Path) -> None:
    client, _, _ = server
    oa, _ = clients(client)
    image = png(32, 32, seed=11)
    content = [image_part(data_uri(image))] * 2
    oa.chat.completions.create(
        model="tiny-vision-text",
        messages=[{"role": "user", "content": content}],
        max_completion_tokens=1,
    )
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(
            model="tiny-vision-text",
            messages=[
                {
                    "role": "user",
                    "content": [image_part(data_uri(b"nope"))],
                }
            ],
            max_completion_tokens=1,
        )
    assert info.value.code == "invalid_media"
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    started = records[0]["media"]  # server_start: the media path as resolved
    assert started["max_vision_tokens"] == 32768 and started["preprocess_threads"] >= 1
    assert started["allow_private"] is False and started["preparation_permits"] >= 1
    assert started["preprocess"]["dtype"] == "float32"  # the engine's dtype on CPU
    start = [r for r in records if r["event"] == "request_start"][-1]
    media = start["media"]
    assert start["media_items"] == media["items"] == media["images"] == 2
    # one build, and the second item either found it done or waited for it (single flight)
    assert media["cache_misses"] == 1 and media["cache_hits"] + media["single_flight_waits"] == 1
    assert media["source_bytes"] == 2 * len(image) and media["payload_bytes"] > 0
    assert media["vision_tokens"] > 0 and media["preprocess_wall_seconds"] >= 0
    rejected = [r for r in records if r["event"] == "request_rejected"][-1]
    assert rejected["media_items"] == 1 and rejected["error"]["code"] == "invalid_media"


def test_images_in_tool_results_keep_their_order_through_the_three_protocols(server: Any) -> None:
    client, _, seen = server
    oa, an = clients(client)
    shot, photo = png(32, 32, seed=21), png(48, 32, seed=22)
    b64 = base64.b64encode
    seen.clear()
    oa.chat.completions.create(
        model="tiny-vision-text",
        messages=[
            chat_user(text_part("Compare"), image_part(data_uri(photo))),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "shot", "arguments": "{}"},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [image_part(data_uri(shot))],
            },
        ],
        tools=[
            {"type": "function", "function": {"name": "shot", "parameters": {"type": "object"}}}
        ],
        max_completion_tokens=1,
        reasoning_effort="none",
    )
    an.messages.create(
        model="any",
        max_tokens=1,
        thinking={"type": "disabled"},
        tools=[{"name": "shot", "input_schema": {"type": "object"}}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare"},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": b64(photo).decode(),
                        },
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "c1", "name": "shot", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "c1",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": b64(shot).decode(),
                                },
                            }
                        ],
                    }
                ],
            },
        ],
    )
    oa.responses.create(
        model="tiny-vision-text",
        max_output_tokens=16,
        reasoning={"effort": "none"},
        tools=[{"type": "function", "name": "shot", "parameters": {"type": "object"}}],
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Compare"},
                    {"type": "input_image", "image_url": data_uri(photo), "detail": "auto"},
                ],
            },
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_image", "image_url": data_uri(shot)}],
            },
        ],
    )
    chat, messages, responses = seen
    assert chat.prompt_token_ids == messages.prompt_token_ids == responses.prompt_token_ids
    digests = [hashlib.sha256(photo).digest(), hashlib.sha256(shot).digest()]
    for request in seen:
        assert [s.digest for s in request.media] == digests  # prompt order
        text = TOK.decode(list(request.prompt_token_ids), skip_special_tokens=False)
        # the screenshot sits inside the tool response the template wrote
        tail = text[text.index("<tool_response>") :]
        assert "<|vision_start|><|image_pad|>" in tail and "</tool_response>" in tail

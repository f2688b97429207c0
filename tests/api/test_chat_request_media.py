"""Chat Completions request parsing: image and video parts (--vision, sources, detail, roles)."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.chat.request import MediaPart, TextPart
from tests.api.chat_request_helpers import body, parse, reject

# -- media --------------------------------------------------------------------------------------

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
VIDEO = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}


@pytest.mark.parametrize(
    "part", [IMAGE, VIDEO, {"type": "image_url", "image_url": "https://example.com/b.png"}]
)
def test_media_without_vision_is_vision_disabled(part):
    err = reject(
        body(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, part]}])
    )
    assert (err.status, err.code, err.param) == (400, "vision_disabled", "messages[0].content[1]")
    assert "--vision" in err.message


def test_media_with_vision_is_kept_in_order():
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                IMAGE,
                {"type": "text", "text": "b"},
                {"type": "text", "text": "c"},
                VIDEO,
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot"}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "image_url", "image_url": "data:image/png;base64,AA"}],
        },
    ]
    r = parse(body(messages=msgs), vision=True)
    assert r.has_media
    assert r.messages[0].parts == (
        TextPart("a"), MediaPart("image", "https://example.com/a.png"), TextPart("b"), TextPart("c"),
        MediaPart("video", "data:video/mp4;base64,AAAA"),
    )  # fmt: skip
    # each media item keeps its source and field until the service takes them out to render
    assert r.template_messages()[0]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "image", "url": "https://example.com/a.png", "param": "messages[0].content[1].image_url.url"},
        {"type": "text", "text": "bc"},
        {"type": "video", "url": "data:video/mp4;base64,AAAA", "param": "messages[0].content[4].video_url.url"},
    ]  # fmt: skip
    assert r.messages[2].media == (MediaPart("image", "data:image/png;base64,AA"),)


@pytest.mark.parametrize(
    ("part", "role", "code", "param"),
    [
        (
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].image_url.detail",
        ),
        (
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].image_url.detail",
        ),
        (
            {"type": "image_url", "image_url": {"url": "ftp://x/a.png"}},
            "user",
            "invalid_media",
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "image_url", "image_url": "file:///etc/passwd"},
            "user",
            "invalid_media",
            "messages[0].content[0].image_url",
        ),
        (
            {"type": "image_url", "image_url": {}},
            "user",
            "missing_required_parameter",
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].type",
        ),
        (
            {"type": "file", "file": {"file_id": "f"}},
            "user",
            "unsupported_value",
            "messages[0].content[0].type",
        ),
        (IMAGE, "system", "invalid_value", "messages[0].content[0].type"),
        (VIDEO, "tool", "invalid_value", "messages[0].content[0].type"),
    ],
)
def test_media_rejections(part, role, code, param):
    msg: dict[str, Any] = {"role": role, "content": [part]}
    if role == "tool":
        msg["tool_call_id"] = "c"
    err = reject(body(messages=[msg]), vision=True)
    assert (err.status, err.code, err.param) == (400, code, param)


def test_image_detail_auto_is_accepted():
    part = {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "auto"}}
    assert parse(body(messages=[{"role": "user", "content": [part]}]), vision=True).has_media

"""Images and videos in a prompt: where their placeholder tokens go and which spans they form.

The three protocols lower image / video content parts to template items
``{"type": "image" | "video", "url": SOURCE, "param": FIELD}`` in their messages. The service
then:

1. `split_media(messages)`: takes the sources out (the template sees ``{"type": "image"}``
   only, never megabytes of base64) and lists them in prompt order as `MediaInput`s;
2. renders and encodes the prompt: the chat template writes one
   ``<|vision_start|><|image_pad|><|vision_end|>`` (or ``<|video_pad|>``) per item, Qwen3-VL /
   Qwen3.5's convention, so the encoded ids hold one pad control token per item;
3. prepares the media (ninfer.media) and `expand_media` replaces each pad as transformers'
   Qwen3-VL processor does::

       image  <|vision_start|> <|image_pad|> x tokens <|vision_end|>
       video  <|vision_start|> for each temporal patch j:
                                 "<{t_j:.1f} seconds>" <|vision_start|> <|video_pad|> x (h*w/m^2) <|vision_end|>
                               <|vision_end|>

   and returns the engine's `MediaSpan`s: one per image, and one per temporal patch of a video
   (grid (1, h, w), its rows of the prepared payload, its timestamp). Qwen3-VL encodes a video
   frame group by frame group (the vision tower's attention never crosses one, and the text
   model's MRoPE indexes each as a grid of t = 1), so per-patch spans are exactly the model's
   view of a video and keep every span's placeholders contiguous.

Token ids come from `VisionTokens`, resolved once from the tokenizer (and checked against the
model config's ``*_token_id`` when it has them). A pad spelling quoted in message text is
ordinary text (the template's content protection), so every pad id in the encoded prompt is one
the template wrote for an item.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenizers import Tokenizer

from ninfer.api.wire.errors import ApiError
from ninfer.errors import ConfigError
from ninfer.media.patches import PreparedMedia
from ninfer.runtime.media_span import MediaSpan

Modality = Literal["image", "video"]

# The Vision envelope of one prompt: merged vision tokens (= 131,072 raw patches).
MAX_VISION_TOKENS = 32_768

SPELLINGS = {
    "vision_start": "<|vision_start|>",
    "vision_end": "<|vision_end|>",
    "image_pad": "<|image_pad|>",
    "video_pad": "<|video_pad|>",
}
# The model config keys (Qwen3-VL / Qwen3.5) that name the same ids.
CONFIG_KEYS = {
    "vision_start": "vision_start_token_id",
    "vision_end": "vision_end_token_id",
    "image_pad": "image_token_id",
    "video_pad": "video_token_id",
}


@dataclass(frozen=True)
class MediaInput:
    """One image or video of a request, in prompt order: its source (http(s) URL or data: URI),
    modality, and the request field it came from (for errors)."""

    url: str
    modality: Modality
    param: str


@dataclass(frozen=True)
class VisionTokens:
    """The control-token ids that frame media in the prompt."""

    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int

    @classmethod
    def resolve(cls, tokenizer: Tokenizer, model_config: Mapping[str, Any]) -> VisionTokens:
        """From the tokenizer's added tokens, checked against the model config's ``*_token_id``
        (top level or ``text_config``) where it gives them. Raises ConfigError naming what is
        missing or inconsistent (a --vision server cannot place media without them)."""
        nested = model_config.get("text_config")
        configs = [model_config, nested if isinstance(nested, Mapping) else {}]
        ids: dict[str, int] = {}
        for name, spelling in SPELLINGS.items():
            tid = tokenizer.token_to_id(spelling)
            if tid is None:
                raise ConfigError(
                    f"--vision: the artifact's tokenizer has no {spelling} token, so media "
                    "cannot be placed in a prompt; drop --vision or use a vision model's tokenizer"
                )
            declared = next(
                (
                    c[CONFIG_KEYS[name]]
                    for c in configs
                    if isinstance(c.get(CONFIG_KEYS[name]), int)
                ),
                None,
            )
            if declared is not None and declared != tid:
                raise ConfigError(
                    f"--vision: the model config's {CONFIG_KEYS[name]} is {declared} but the "
                    f"tokenizer spells {spelling} as id {tid}; the artifact is inconsistent"
                )
            ids[name] = tid
        return cls(**ids)

    @property
    def pads(self) -> dict[int, Modality]:
        return {self.image_pad: "image", self.video_pad: "video"}


def split_media(
    messages: Sequence[Mapping[str, Any]], param: str
) -> tuple[list[dict[str, Any]], tuple[MediaInput, ...]]:
    """(messages whose media items keep only their type, the media sources in order).

    `param` is the request field holding the conversation ("messages" / "input"), named in
    errors for an item that did not record its own field. Messages without media are returned
    as they are (not copied)."""
    out: list[dict[str, Any]] = []
    found: list[MediaInput] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_media(it) for it in content):
            out.append(message)  # type: ignore[arg-type]
            continue
        items = []
        for item in content:
            if _is_media(item):
                url = item.get("url")
                if not isinstance(url, str):  # the protocol layer always records it
                    raise ValueError(f"a {item['type']} item without its source: {item.keys()}")
                found.append(MediaInput(url, item["type"], str(item.get("param") or param)))
                items.append({"type": item["type"]})
            else:
                items.append(item)
        out.append({**message, "content": items})
    return out, tuple(found)


def _is_media(item: object) -> bool:
    return isinstance(item, Mapping) and item.get("type") in ("image", "video")


@dataclass(frozen=True)
class PromptMedia:
    """One prepared item to place: its payload and the SHA-256 of its source bytes."""

    media: PreparedMedia
    digest: bytes


@dataclass(frozen=True)
class Expansion:
    """A prompt with its media placed. `ids`: the expanded prompt; `spans`: the engine's
    MediaSpans in order; `growth`: (index in the unexpanded ids of a pad, ids it added), for
    `position` to map unexpanded positions; `vision_tokens`: merged tokens of all spans."""

    ids: list[int]
    spans: tuple[MediaSpan, ...]
    growth: tuple[tuple[int, int], ...]

    @property
    def vision_tokens(self) -> int:
        return sum(s.tokens for s in self.spans)

    def position(self, p: int) -> int:
        """Where position `p` of the unexpanded prompt lands (a pad's own position stays at
        the start of its expansion)."""
        return p + sum(added for at, added in self.growth if at < p)


def expand_media(
    ids: Sequence[int],
    items: Sequence[PromptMedia],
    tokens: VisionTokens,
    encode_text: Callable[[str], list[int]],
    param: str,
) -> Expansion:
    """Replace the pad id of each item by its placeholder run (see the module docstring).

    Raises ApiError invalid_prompt when the template did not write exactly one pad of the right
    modality per item, in order (a template that drops or reorders media)."""
    pads = [(i, tokens.pads[t]) for i, t in enumerate(ids) if t in tokens.pads]
    kinds = [p.media.modality for p in items]
    if [m for _, m in pads] != kinds:
        raise ApiError(
            400,
            f"the chat template placed {_census([m for _, m in pads])} for a request with "
            f"{_census(kinds)}; it must render each image/video item once, in order",
            code="invalid_prompt",
            param=param,
        )
    out: list[int] = []
    spans: list[MediaSpan] = []
    growth: list[tuple[int, int]] = []
    pos = 0
    for (at, modality), item in zip(pads, items, strict=True):
        out.extend(ids[pos:at])
        pos = at + 1
        before = len(out)
        media = item.media
        if modality == "image":
            spans.append(
                MediaSpan(len(out), media.tokens, media.grid_thw, item.digest, "image", media)
            )
            out.extend([tokens.image_pad] * media.tokens)
        else:
            for frame in video_frames(media, item.digest):
                out.extend(encode_text(f"<{frame.timestamps[0]:.1f} seconds>"))
                out.append(tokens.vision_start)
                spans.append(
                    MediaSpan(
                        len(out), frame.media.tokens, frame.media.grid_thw, frame.digest,
                        "video", frame.media, frame.timestamps,
                    )
                )  # fmt: skip
                out.extend([tokens.video_pad] * frame.media.tokens)
                out.append(tokens.vision_end)
        growth.append((at, len(out) - before - 1))
    out.extend(ids[pos:])
    return Expansion(out, tuple(spans), tuple(growth))


@dataclass(frozen=True)
class VideoFrame:
    """One temporal patch of a video as its own item: rows t*h*w.. of the payload (a view, no
    copy), grid (1, h, w), its timestamp, and a digest that names the video and the patch."""

    media: PreparedMedia
    digest: bytes
    timestamps: tuple[float, ...]


def video_frames(media: PreparedMedia, digest: bytes) -> list[VideoFrame]:
    t, h, w = media.grid_thw
    per_rows, per_tokens = h * w, media.tokens // t
    stamps = media.timestamps if len(media.timestamps) == t else tuple(0.0 for _ in range(t))
    frames = []
    for j in range(t):
        rows = media.pixel_values[j * per_rows : (j + 1) * per_rows]
        part = PreparedMedia("video", rows, (1, h, w), per_tokens, (stamps[j],))
        tagged = hashlib.sha256(digest + j.to_bytes(4, "big")).digest()
        frames.append(VideoFrame(part, tagged, (stamps[j],)))
    return frames


def _census(kinds: Sequence[str]) -> str:
    images, videos = kinds.count("image"), kinds.count("video")
    return f"{images} image(s) and {videos} video(s)"

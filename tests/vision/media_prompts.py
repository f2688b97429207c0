"""Media prompts of the vision tests: real media made here (a PNG with pillow, an MP4 with
PyAV) prepared by ninfer.media into prompt ids with `MediaSpan`s, laid out as transformers'
Qwen3.5 processor lays them out (an image's placeholders between vision start / end; a video
frame by frame, each temporal patch after its "<t seconds>" timestamp)."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ninfer.artifact.format import Artifact
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.image import prepare_image
from ninfer.media.patches import PreparedMedia
from ninfer.media.video import prepare_video
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.tokenizer import Tokenizer


def png(width: int, height: int, seed: int) -> bytes:
    """A PNG of random pixels (pillow)."""
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def mp4(frames: int, width: int, height: int, fps: int, seed: int) -> bytes:
    """An MPEG-4 video of random frames (PyAV)."""
    import av

    out = io.BytesIO()
    rng = np.random.default_rng(seed)
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


@dataclass(frozen=True)
class MediaPrompt:
    """Prompt ids with their media, and what transformers needs to compute the same."""

    ids: list[int]
    spans: tuple[MediaSpan, ...]
    token_types: list[int]  # 0 text, 1 image, 2 video (transformers' mm_token_type_ids)
    videos: tuple[PreparedMedia, ...] = ()  # whole videos, as the reference takes them

    def reference_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments of the transformers model's forward / generate."""
        kw: dict[str, torch.Tensor] = {
            "input_ids": torch.tensor([self.ids]),
            "mm_token_type_ids": torch.tensor([self.token_types]),
        }
        images = [s.prepared for s in self.spans if s.modality == "image"]
        for key, items in (("pixel_values", images), ("pixel_values_videos", self.videos)):
            if items:
                kw[key] = torch.cat([m.pixel_values for m in items])
                kw[f"{items[0].modality}_grid_thw"] = torch.tensor([m.grid_thw for m in items])
        return kw


class PromptBuilder:
    """Builds media prompts for one vision artifact, its preprocessing read from the artifact
    (float32 patch rows: the reference numerics)."""

    def __init__(self, path: Path) -> None:
        art = Artifact(path)
        pre = art.preprocessor
        self.config = VisionPreprocessConfig.from_hf(pre["image"], pre["video"], dtype="float32")
        self.tokenizer = Tokenizer(art.tokenizer_json, art.special_tokens)
        c = art.config
        self.start, self.end = c["vision_start_token_id"], c["vision_end_token_id"]
        self.image_id, self.video_id = c["image_token_id"], c["video_token_id"]
        self.ids: list[int] = []
        self.types: list[int] = []
        self.spans: list[MediaSpan] = []
        self._videos: list[PreparedMedia] = []

    def text(self, text: str) -> PromptBuilder:
        ids = self.tokenizer.encode(text)
        self.ids += ids
        self.types += [0] * len(ids)
        return self

    def _run(self, n: int, placeholder: int, kind: int) -> int:
        self.ids.append(self.start)
        offset = len(self.ids)
        self.ids += [placeholder] * n + [self.end]
        self.types += [0] + [kind] * n + [0]
        return offset

    def image(self, data: bytes) -> PromptBuilder:
        m = prepare_image(data, self.config)
        offset = self._run(m.tokens, self.image_id, 1)
        self.spans.append(_span(offset, m, data))
        return self

    def video(self, data: bytes, per_frame: bool = False) -> PromptBuilder:
        """One span for the video with its `frame_offsets`; `per_frame`: one span per temporal
        patch instead (grid (1, h, w), its own rows and digest), as the protocol layer does."""
        m = prepare_video(data, self.config)
        t, h, w = m.grid_thw
        per = m.tokens // t
        offsets = []
        for k, ts in enumerate(m.timestamps):
            self.text(f"<{ts:.1f} seconds>")
            offsets.append(self._run(per, self.video_id, 2))
            if per_frame:
                rows = m.pixel_values[k * h * w : (k + 1) * h * w]
                frame = PreparedMedia("video", rows, (1, h, w), per, (ts,))
                self.spans.append(_span(offsets[-1], frame, data + bytes([k])))
        if not per_frame:
            self.spans.append(_span(offsets[0], m, data, tuple(offsets)))
        self._videos.append(m)
        return self

    def build(self) -> MediaPrompt:
        return MediaPrompt(list(self.ids), tuple(self.spans), list(self.types), tuple(self._videos))


def _span(offset: int, m: PreparedMedia, data: bytes, frames: tuple[int, ...] = ()) -> MediaSpan:
    return MediaSpan(
        offset, m.tokens, m.grid_thw, hashlib.sha256(data).digest(), m.modality, m,
        m.timestamps, frames,
    )  # fmt: skip

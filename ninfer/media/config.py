"""Preprocessing settings of the vision tower, read once from the model's processor config.

`VisionPreprocessConfig` holds what turns pixels into the patch rows the Qwen3.5 vision patch
embedding consumes (patch and merge sizes, pixel budgets, normalisation), plus the server's own
bounds on what it will decode. The defaults are Qwen3-VL / Qwen3.5's
(``preprocessor_config.json`` / ``video_preprocessor_config.json``); `from_hf` reads the actual
files' dictionaries. Loading the files is the caller's job.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal


@dataclass(frozen=True)
class VisionPreprocessConfig:
    """Units: pixels, frames, frames per second.

    patch_size, temporal_patch_size, merge_size: the vision tower's patch geometry; resized
    sides are multiples of ``factor = patch_size * merge_size``.
    image_min_pixels / image_max_pixels: the resized area budget of one image.
    video_min_pixels / video_max_pixels: the resized volume budget of one video
    (frames x height x width).
    video_fps, video_min_frames, video_max_frames: frame sampling.
    max_source_pixels: the largest decoded frame accepted (width x height of the source, checked
    from the header before decoding: decompression bombs).
    max_video_seconds: the longest video accepted.
    dtype: the element type of the prepared patch rows.
    """

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_min_pixels: int = 65536
    image_max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    video_min_pixels: int = 4096
    video_max_pixels: int = 25165824
    video_fps: float = 2.0
    video_min_frames: int = 4
    video_max_frames: int = 768
    max_source_pixels: int = 89_478_485  # Pillow's own decompression-bomb threshold
    max_video_seconds: float = 3600.0
    dtype: Literal["bfloat16", "float32"] = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "image_min_pixels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"VisionPreprocessConfig.{name} must be positive")
        if self.image_max_pixels < self.image_min_pixels:
            raise ValueError("VisionPreprocessConfig: image_max_pixels < image_min_pixels")
        if self.video_max_pixels < self.video_min_pixels:
            raise ValueError("VisionPreprocessConfig: video_max_pixels < video_min_pixels")
        if self.video_fps <= 0 or not 0 < self.video_min_frames <= self.video_max_frames:
            raise ValueError("VisionPreprocessConfig: bad video frame sampling settings")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or 0 in self.image_std:
            raise ValueError("VisionPreprocessConfig: image_mean/std need three nonzero values")

    @property
    def factor(self) -> int:
        """The side granularity of a resized image: one merged token covers factor x factor."""
        return self.patch_size * self.merge_size

    def key(self) -> tuple[Any, ...]:
        """Every field, for cache keys: a prepared payload is only valid for these settings."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def from_hf(
        cls,
        image: dict[str, Any],
        video: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> VisionPreprocessConfig:
        """From ``preprocessor_config.json`` (and ``video_preprocessor_config.json``) contents.

        Missing keys keep the defaults; `overrides` set server-side fields (dtype, bounds).
        """
        out: dict[str, Any] = {}
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            if name in image:
                out[name] = int(image[name])
        size = image.get("size") or {}
        if "shortest_edge" in size or "min_pixels" in image:
            out["image_min_pixels"] = int(size.get("shortest_edge", image.get("min_pixels")))
        if "longest_edge" in size or "max_pixels" in image:
            out["image_max_pixels"] = int(size.get("longest_edge", image.get("max_pixels")))
        for src, dst in (("image_mean", "image_mean"), ("image_std", "image_std")):
            if src in image:
                out[dst] = tuple(float(v) for v in image[src])
        if video:
            vsize = video.get("size") or {}
            if "shortest_edge" in vsize:
                out["video_min_pixels"] = int(vsize["shortest_edge"])
            if "longest_edge" in vsize:
                out["video_max_pixels"] = int(vsize["longest_edge"])
            if video.get("fps") is not None:
                out["video_fps"] = float(video["fps"])
            if video.get("min_frames") is not None:
                out["video_min_frames"] = int(video["min_frames"])
            if video.get("max_frames") is not None:
                out["video_max_frames"] = int(video["max_frames"])
        out.update(overrides)
        return cls(**out)

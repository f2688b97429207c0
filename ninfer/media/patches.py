"""Shared geometry of image and video preparation: smart resize, normalisation, patch rows.

The layout is what the Qwen2-VL / Qwen3-VL / Qwen3.5 vision patch embedding consumes. For a
clip of T frames (an image is one frame repeated to ``temporal_patch_size``) resized to H x W::

    frames [T, C, H, W] -> grid (t, h, w) = (T / tp, H / p, W / p)
    rows   [t * h * w, C * tp * p * p], ordered t, h/m, w/m, m, m (m = merge_size), so that each
           run of m*m consecutive rows is one merged token; within a row: C, tp, p, p.

`PreparedMedia` is the immutable result the cache holds and the vision tower reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ninfer.media import errors
from ninfer.media.config import VisionPreprocessConfig

_MAX_ASPECT = 200  # the reference processors refuse more extreme shapes


@dataclass(frozen=True)
class PreparedMedia:
    """One prepared image or video.

    pixel_values: [t*h*w, C*tp*p*p] in the config's dtype (see the module docstring).
    grid_thw: (t, h, w) in patches. timestamps: per temporal patch, the mean time in seconds of
    its frames (video only; empty for images). tokens: merged vision tokens, h*w*t / m^2.
    The cache shares one instance between requests: nobody may write to pixel_values.
    """

    modality: Literal["image", "video"]
    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    tokens: int
    timestamps: tuple[float, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.pixel_values.numel() * self.pixel_values.element_size()


def check_aspect(height: int, width: int) -> None:
    if min(height, width) <= 0:
        raise errors.invalid_media(f"the media has an empty frame ({width}x{height})")
    if max(height, width) / min(height, width) > _MAX_ASPECT:
        raise errors.invalid_media(
            f"the media's aspect ratio {width}x{height} is more extreme than {_MAX_ASPECT}:1"
        )


def smart_resize_image(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor` with area in [min_pixels, max_pixels],
    the aspect ratio kept as closely as possible (Qwen2-VL's rule)."""
    check_aspect(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video(
    frames: int,
    height: int,
    width: int,
    factor: int,
    temporal_factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """The per-frame (height, width) of a clip: as `smart_resize_image`, but the budget covers
    frames x height x width, and sides smaller than `factor` are first scaled up (Qwen3-VL)."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    check_aspect(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def normalization_table(config: VisionPreprocessConfig) -> np.ndarray:
    """float32 [C, 256]: the normalised value of every uint8 level in every channel.

    Computed as transformers' processors compute each pixel (x / 255 in float64, cast to
    float32, then (x - mean) / std in float32), so a table lookup gives their exact bits
    without materialising float64 or float32 copies of the whole frame.
    """
    levels = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(config.image_mean, dtype=np.float32)[:, None]
    std = np.array(config.image_std, dtype=np.float32)[:, None]
    return (levels[None, :] - mean) / std


def pack(frames: np.ndarray, config: VisionPreprocessConfig) -> tuple[torch.Tensor, tuple]:
    """uint8 frames [T, H, W, C] -> (normalised rows [t*h*w, C*tp*p*p] in the config's dtype,
    grid (t, h, w)). T is padded to a multiple of temporal_patch_size by repeating the last frame.

    The rearrangement runs on uint8 (one byte per value); normalisation is a per-channel table
    lookup written straight into the output, so the peak is the output plus one channel.
    """
    p, m, tp = config.patch_size, config.merge_size, config.temporal_patch_size
    if pad := -frames.shape[0] % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)], axis=0)
    n, height, width, c = frames.shape
    t, h, w = n // tp, height // p, width // p
    x = frames.reshape(t, tp, h // m, m, p, w // m, m, p, c)
    # -> [t, h/m, w/m, m(h), m(w), C, tp, p(h), p(w)]: m*m consecutive rows form one merged token
    x = np.ascontiguousarray(x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)).reshape(t * h * w, c, -1)
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    rows = torch.empty(t * h * w, c, tp * p * p, dtype=dtype)
    table = normalization_table(config)
    for channel in range(c):
        values = np.take(table[channel], x[:, channel])  # float32 [rows, tp*p*p]
        rows[:, channel] = torch.from_numpy(values)  # rounds to bfloat16 when that is the dtype
    return rows.reshape(t * h * w, c * tp * p * p), (t, h, w)


def to_prepared(
    modality: Literal["image", "video"],
    rows: torch.Tensor,
    grid: tuple[int, int, int],
    config: VisionPreprocessConfig,
    timestamps: tuple[float, ...] = (),
) -> PreparedMedia:
    t, h, w = grid
    return PreparedMedia(modality, rows, grid, t * h * w // (config.merge_size**2), timestamps)

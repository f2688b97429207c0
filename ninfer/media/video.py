"""Video preparation: bytes -> sampled RGB frames with timestamps -> resized patch rows.

`prepare_video(data, config)` follows transformers' Qwen3-VL video path (the one Qwen3.5 uses):

1. The container is recognised from its first bytes (MP4/QuickTime, Matroska/WebM, AVI, MPEG
   program/transport stream, Ogg) and opened with that demuxer named explicitly, so FFmpeg never
   probes a playlist or concat format that could open other files or URLs.
2. Metadata as PyAV reports it: frame count (counted from packets when the container does not
   say) and average frame rate. Frames are sampled at `config.video_fps`:
   ``n = clamp(int(frames / rate * fps), min_frames, min(max_frames, frames))`` and indices
   ``linspace(0, frames - 1, n).round()``.
3. The per-frame size is Qwen3-VL's smart resize over the clip's volume budget; each selected
   frame is converted to RGB and resized as it is decoded (bicubic, antialiased, on uint8: the
   operation torchvision performs for the reference processor), so memory stays within the
   resized budget however large the source frames are.
4. The frame count is padded to a multiple of `temporal_patch_size` by repeating the last frame;
   each temporal patch gets the mean timestamp of its first and last frame, in seconds.

Errors: ``invalid_media`` for bytes that are not a video of an accepted container, a container
without a video stream or decodable frames; ``media_budget_exceeded`` for frames larger than
`config.max_source_pixels` or a clip longer than `config.max_video_seconds`.
"""

from __future__ import annotations

import io

import av
import numpy as np
import torch

from ninfer.media import errors
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.patches import PreparedMedia, pack, smart_resize_video, to_prepared


def sniff_container(data: bytes) -> str | None:
    """The FFmpeg demuxer for `data`'s container, from its magic bytes; None if unrecognised."""
    head = data[:64]
    if len(head) >= 12 and head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):
        return "mov"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "avi"
    if head.startswith(b"\x00\x00\x01\xba"):
        return "mpeg"
    if head.startswith(b"OggS"):
        return "ogg"
    if len(data) > 376 and data[0] == 0x47 and data[188] == 0x47 and data[376] == 0x47:
        return "mpegts"
    return None


def sample_indices(frames: int, rate: float, config: VisionPreprocessConfig) -> np.ndarray:
    """Indices of the frames kept when sampling `frames` frames at `rate` fps down to
    `config.video_fps` (transformers' Qwen3-VL rule)."""
    n = int(frames / rate * config.video_fps)
    n = min(max(n, config.video_min_frames), config.video_max_frames, frames)
    return np.linspace(0, frames - 1, n).round().astype(int)


def patch_timestamps(indices: np.ndarray, rate: float, temporal: int) -> tuple[float, ...]:
    """Seconds of each temporal patch: the mean of its first and last frame's time."""
    idx = [int(i) for i in indices]
    if pad := -len(idx) % temporal:
        idx += [idx[-1]] * pad
    times = [i / rate for i in idx]
    return tuple((times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal))


def resize_frame(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [height, width, 3], bicubic with antialiasing."""
    if rgb.shape[:2] == (height, width):
        return rgb
    x = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None]  # [1, 3, H, W]
    y = torch.nn.functional.interpolate(
        x, size=(height, width), mode="bicubic", align_corners=False, antialias=True
    )
    return y[0].permute(1, 2, 0).numpy()


def prepare_video(data: bytes, config: VisionPreprocessConfig) -> PreparedMedia:
    """Encoded video bytes -> `PreparedMedia` (see the module docstring). Thread-safe."""
    demuxer = sniff_container(data)
    if demuxer is None:
        raise errors.invalid_media(
            "the bytes are not a video in an accepted container (MP4/QuickTime, Matroska/WebM, "
            "AVI, MPEG-PS/TS, Ogg)"
        )
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            return _prepare(container, data, demuxer, config)
    except errors.MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, EOFError) as e:
        raise errors.invalid_media(f"the video is truncated or corrupt: {e}") from e


def _prepare(
    container: av.container.InputContainer,
    data: bytes,
    demuxer: str,
    config: VisionPreprocessConfig,
) -> PreparedMedia:
    if not container.streams.video:
        raise errors.invalid_media("the video has no video stream")
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > config.max_source_pixels:
        raise errors.budget_exceeded(
            f"the video's frames are {width}x{height} = {width * height} pixels, more than the "
            f"limit of {config.max_source_pixels} pixels"
        )
    rate = float(stream.average_rate or stream.guessed_rate or 0)
    if rate <= 0:
        raise errors.invalid_media("the video does not declare a frame rate")
    total = int(stream.frames or 0)
    if total <= 0:
        total = _count_frames(data, demuxer, config, rate)
    if total <= 0:
        raise errors.invalid_media("the video has no frames")
    if total / rate > config.max_video_seconds:
        raise errors.budget_exceeded(
            f"the video is {total / rate:.0f} s long, more than the limit of "
            f"{config.max_video_seconds:g} s"
        )
    indices = sample_indices(total, rate, config)
    # A clip shorter than one temporal patch is padded below; size it as one full patch.
    new_h, new_w = smart_resize_video(
        max(len(indices), config.temporal_patch_size),
        height,
        width,
        config.factor,
        config.temporal_patch_size,
        config.video_min_pixels,
        config.video_max_pixels,
    )
    wanted = {int(i) for i in indices}
    kept: list[np.ndarray] = []
    last = int(indices[-1])
    for i, frame in enumerate(container.decode(stream)):
        if i > last:
            break
        if i in wanted:
            rgb = frame.to_ndarray(format="rgb24")
            kept.append(resize_frame(rgb, new_h, new_w))
    if len(kept) != len(indices):
        raise errors.invalid_media(
            f"the video declares {total} frames but only {len(kept)} of the {len(indices)} "
            "sampled ones could be decoded"
        )
    rows, grid = pack(np.stack(kept), config)
    stamps = patch_timestamps(indices, rate, config.temporal_patch_size)
    return to_prepared("video", rows, grid, config, stamps)


def _count_frames(data: bytes, demuxer: str, config: VisionPreprocessConfig, rate: float) -> int:
    """Frames counted from the video packets, for containers that do not record the count."""
    limit = int(config.max_video_seconds * rate) + 1
    count = 0
    with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
        for packet in container.demux(container.streams.video[0]):
            if packet.size:
                count += 1
                if count > limit:
                    break
    return count

"""Video preparation against transformers' Qwen3-VL video path (Qwen3.5's), on small videos
made here with PyAV.

torchvision, which transformers' video processor resizes with, has no build for this torch, so
the reference is assembled from transformers' own pieces (PyAV metadata as its reader takes it,
`sample_frames`, `smart_resize`, rescale/normalise, `patchify`, the processor's frame
timestamps) around the one operation torchvision's uint8 bicubic resize performs on CPU
(`torch.nn.functional.interpolate(..., mode="bicubic", antialias=True)` on the uint8 tensor).
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from transformers.image_transforms import normalize, rescale
from transformers.image_utils import ChannelDimension
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
    Qwen3VLVideoProcessor,
    smart_resize,
)
from transformers.video_utils import VideoMetadata

from ninfer.media import errors
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.video import prepare_video

CONFIG = VisionPreprocessConfig(
    video_min_pixels=4096, video_max_pixels=64 * 64 * 8, video_fps=2.0, dtype="float32"
)


def make_video(
    frames: int, width: int, height: int, fps: int, container: str = "mp4", codec: str = "mpeg4"
) -> bytes:
    """A clip with a gradient background and a square that moves one step per frame."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, fps)
        for i in range(frames):
            arr = np.zeros((height, width, 3), dtype=np.uint8)
            arr[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
            arr[..., 1] = np.linspace(255, 0, height, dtype=np.uint8)[:, None]
            x = (i * 3) % max(width - 10, 1)
            arr[10:20, x : x + 10, 2] = 255
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def reference(
    data: bytes, frames_made: int, config: VisionPreprocessConfig
) -> tuple[np.ndarray, list, list]:
    """transformers' result; `frames_made` stands in for a container that records no count
    (Matroska), which transformers' own PyAV reader does not handle."""
    processor = Qwen3VLVideoProcessor(
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        merge_size=config.merge_size,
        min_frames=config.video_min_frames,
        max_frames=config.video_max_frames,
    )
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        total, rate = int(stream.frames) or frames_made, float(stream.average_rate)
        metadata = VideoMetadata(total_num_frames=total, fps=rate, duration=total / rate)
        indices = processor.sample_frames(metadata, fps=config.video_fps)
        frames = [
            f.to_ndarray(format="rgb24")
            for i, f in enumerate(container.decode(video=0))
            if i in set(indices.tolist())
        ]
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)  # [T, C, H, W] uint8
    height, width = video.shape[-2:]
    new_h, new_w = smart_resize(
        len(frames), height, width, config.temporal_patch_size, config.factor,
        config.video_min_pixels, config.video_max_pixels,
    )  # fmt: skip
    if (new_h, new_w) != (height, width):
        video = torch.nn.functional.interpolate(
            video, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True
        )
    mean, std = list(config.image_mean), list(config.image_std)
    first = ChannelDimension.FIRST
    pixels = [
        normalize(rescale(f, 1 / 255, input_data_format=first), mean, std, input_data_format=first)
        for f in video.numpy()
    ]
    stacked = torch.from_numpy(np.stack(pixels))[None]  # [1, T, C, H, W]
    rows, t, h, w = processor.patchify(
        stacked, config.patch_size, config.merge_size, config.temporal_patch_size
    )
    stamps = Qwen3VLProcessor._calculate_timestamps(None, indices, rate, config.temporal_patch_size)
    return rows[0].numpy(), [t, h, w], stamps


@pytest.mark.parametrize(
    "frames,width,height,fps,container,codec",
    [
        (30, 70, 50, 10, "mp4", "mpeg4"),  # 6 sampled frames -> 3 temporal patches
        (23, 96, 40, 8, "mp4", "libx264"),  # 5 sampled frames: padded to 6
        (9, 200, 120, 3, "matroska", "libvpx"),  # no frame count in the container
    ],
)
def test_matches_the_transformers_video_path(
    frames: int, width: int, height: int, fps: int, container: str, codec: str
) -> None:
    data = make_video(frames, width, height, fps, container, codec)
    prepared = prepare_video(data, CONFIG)
    ref_rows, ref_grid, ref_stamps = reference(data, frames, CONFIG)
    assert list(prepared.grid_thw) == ref_grid
    assert prepared.pixel_values.shape == ref_rows.shape
    np.testing.assert_allclose(prepared.pixel_values.numpy(), ref_rows, rtol=0, atol=1e-5)
    assert prepared.timestamps == pytest.approx(ref_stamps)
    t, h, w = prepared.grid_thw
    assert len(prepared.timestamps) == t and prepared.tokens == t * h * w // 4


def test_sampling_follows_the_target_fps() -> None:
    data = make_video(40, 64, 64, 10)  # 4 s at 10 fps -> 8 frames at 2 fps -> 4 temporal patches
    prepared = prepare_video(data, CONFIG)
    assert prepared.grid_thw[0] == 4
    assert prepared.timestamps[0] == pytest.approx((0 + 6 / 10) / 2)
    assert prepared.timestamps[-1] == pytest.approx((33 / 10 + 39 / 10) / 2)


def test_bad_videos_are_refused() -> None:
    good = make_video(20, 64, 48, 10)
    for data, word in [
        (b"definitely not a video", "accepted container"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, "accepted container"),
        (good[: len(good) // 3], "video"),
        (b"\x00\x00\x00\x20ftypisom" + b"\x00" * 200, "video"),
    ]:
        with pytest.raises(errors.MediaError) as info:
            prepare_video(data, CONFIG)
        assert info.value.code == errors.INVALID_MEDIA, (data[:20], info.value)
        assert word in info.value.message
    with pytest.raises(errors.MediaError) as info:
        prepare_video(good, VisionPreprocessConfig(max_video_seconds=1.0, dtype="float32"))
    assert info.value.code == errors.MEDIA_BUDGET_EXCEEDED and "2 s long" in info.value.message
    with pytest.raises(errors.MediaError) as info:
        prepare_video(good, VisionPreprocessConfig(max_source_pixels=1000, dtype="float32"))
    assert info.value.code == errors.MEDIA_BUDGET_EXCEEDED and "64x48" in info.value.message

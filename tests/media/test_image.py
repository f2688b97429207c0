"""Image preparation against transformers' Qwen2-VL image processor (the one Qwen3-VL and
Qwen3.5 use), and the refusals of bad, truncated and oversized images."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ninfer.media import errors
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.image import prepare_image

CONFIG = VisionPreprocessConfig(
    image_min_pixels=4096, image_max_pixels=96 * 96 * 4, dtype="float32"
)


def reference(image: Image.Image, config: VisionPreprocessConfig) -> tuple[np.ndarray, list[int]]:
    processor = Qwen2VLImageProcessorPil(
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        merge_size=config.merge_size,
        image_mean=list(config.image_mean),
        image_std=list(config.image_std),
        size={"shortest_edge": config.image_min_pixels, "longest_edge": config.image_max_pixels},
    )
    out = processor(images=[ImageOps.exif_transpose(image)], return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"][0].tolist()


def encode(image: Image.Image, fmt: str = "PNG", **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    # a smooth gradient on top of the noise, so resizing has structure to preserve
    arr[..., 0] = (np.arange(width)[None, :] * 255 // max(width - 1, 1)).astype(np.uint8)
    return Image.fromarray(arr[..., 0] if mode == "L" else arr, mode)


@pytest.mark.parametrize(
    "width,height,mode",
    [
        (37, 53, "RGB"),
        (301, 191, "RGB"),
        (999, 23, "RGB"),
        (5, 7, "RGB"),
        (211, 97, "RGBA"),
        (64, 130, "L"),
    ],
)
def test_matches_the_transformers_image_processor(width: int, height: int, mode: str) -> None:
    image = noise(width, height, mode, seed=width)
    data = encode(image)
    prepared = prepare_image(data, CONFIG)
    ref_pixels, ref_grid = reference(Image.open(io.BytesIO(data)), CONFIG)
    assert list(prepared.grid_thw) == ref_grid
    assert prepared.pixel_values.dtype == torch.float32
    assert prepared.pixel_values.shape == ref_pixels.shape
    np.testing.assert_allclose(prepared.pixel_values.numpy(), ref_pixels, rtol=0, atol=1e-5)
    t, h, w = prepared.grid_thw
    assert t == 1 and prepared.tokens == h * w // 4
    assert h * w * 16 * 16 <= CONFIG.image_max_pixels


def test_palette_transparency_and_exif_orientation() -> None:
    base = noise(120, 40, seed=3)
    pal = base.convert("P", palette=Image.Palette.ADAPTIVE)
    pal.info["transparency"] = 0
    data = encode(pal, transparency=0)
    ref_pixels, ref_grid = reference(Image.open(io.BytesIO(data)), CONFIG)
    prepared = prepare_image(data, CONFIG)
    np.testing.assert_allclose(prepared.pixel_values.numpy(), ref_pixels, rtol=0, atol=1e-5)

    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    rotated = encode(base, "JPEG", exif=exif, quality=95)
    prepared = prepare_image(rotated, CONFIG)
    upright = prepare_image(encode(base, "JPEG", quality=95), CONFIG)
    _, h, w = prepared.grid_thw
    assert (h, w) == (upright.grid_thw[2], upright.grid_thw[1])  # portrait now
    ref_pixels, ref_grid = reference(Image.open(io.BytesIO(rotated)), CONFIG)
    assert list(prepared.grid_thw) == ref_grid
    np.testing.assert_allclose(prepared.pixel_values.numpy(), ref_pixels, rtol=0, atol=1e-5)


def test_bfloat16_payload_is_the_rounded_float32_one() -> None:
    data = encode(noise(77, 66))
    f32 = prepare_image(data, CONFIG)
    bf16 = prepare_image(data, VisionPreprocessConfig(**{**CONFIG.__dict__, "dtype": "bfloat16"}))
    assert bf16.pixel_values.dtype == torch.bfloat16
    assert torch.equal(bf16.pixel_values, f32.pixel_values.to(torch.bfloat16))
    assert bf16.nbytes * 2 == f32.nbytes


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height RGB pixels but carries (almost) no pixel data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [20000, 10000])
def test_decompression_bombs_are_refused_from_the_header(side: int) -> None:
    data = png_header_only(side, side)
    assert len(data) < 200
    with pytest.raises(errors.MediaError) as info:
        prepare_image(data, CONFIG)
    assert info.value.code == errors.MEDIA_BUDGET_EXCEEDED and info.value.status == 400
    assert str(CONFIG.max_source_pixels) in info.value.message


@pytest.mark.parametrize(
    "data,word",
    [
        (b"", "empty"),
        (b"hello, this is not an image", "not an image"),
        (b"<html><body>404</body></html>", "not an image"),
        (encode(noise(200, 150))[:400], "truncated"),
        (encode(noise(200, 150), "JPEG")[:300], "truncated"),
        (png_header_only(40, 40), "truncated"),
        (encode(noise(3, 700)), "aspect ratio"),
    ],
)
def test_bad_bytes_are_invalid_media(data: bytes, word: str) -> None:
    with pytest.raises(errors.MediaError) as info:
        prepare_image(data, CONFIG)
    assert info.value.code == errors.INVALID_MEDIA and info.value.status == 400
    assert word in info.value.message, info.value.message

"""Weight storage formats: quantisers and reference dequantisers.

| format       | parts                                                            | value                         |
| ------------ | ---------------------------------------------------------------- | ----------------------------- |
| f32          | data float32 [shape]                                             | data                          |
| f16          | data float16 [shape]                                             | data                          |
| bf16         | data uint16 [shape] (the high half of the float32 bit pattern)    | data                          |
| fp8          | data uint8 [N, K] (e4m3fn bits), scale float32 [N]               | e4m3(data) * scale[:, None]   |
| nvfp4        | data uint8 [N, K/2], scale uint8 [N, K/16] (e4m3fn bits),        | e2m1 * e4m3(scale) * global   |
|              | global_scale float32 [1]                                         |                               |
| gguf:<TYPE>  | data uint8 [N, row bytes] (GGML blocks of TYPE along K)          | gguf_blocks.dequantize_blocks |

fp8 scales are per output channel (row); nvfp4 packs element 2i in the low nibble of byte i and
element 2i+1 in the high nibble, e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} with bit 3 the
sign, one e4m3 scale per 16 consecutive values along K and one fp32 global scale.

Quantisers accept float32 numpy arrays. They use torch only for the exact float -> e4m3 cast.
"""

from __future__ import annotations

import numpy as np

from ninfer.artifact.format import StoredTensor
from ninfer.artifact.gguf_blocks import dequantize_blocks
from ninfer.errors import ConvertError

FP8_MAX = 448.0
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
NVFP4_BLOCK = 16
WEIGHT_FORMATS = ("bf16", "fp8", "nvfp4")


def _e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn bit patterns (NaN for 0x7f/0xff)."""
    b = np.arange(256, dtype=np.uint32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    val = np.where(
        exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7)
    )
    val = sign * val
    val[(b & 0x7F) == 0x7F] = np.nan
    return val.astype(np.float32)


E4M3_VALUES = _e4m3_table()


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """Round float32 values (already within ±448) to e4m3fn bit patterns, nearest-even."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).clamp(-FP8_MAX, FP8_MAX)
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def e4m3_decode(bits: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[bits]


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_decode(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


# -- quantisers ------------------------------------------------------------------------------


def plain(x: np.ndarray, fmt: str = "f32") -> StoredTensor:
    x = np.asarray(x)
    if fmt == "f32":
        data = x.astype(np.float32, copy=False)
    elif fmt == "f16":
        data = x.astype(np.float16, copy=False)
    elif fmt == "bf16":
        data = bf16_encode(x.astype(np.float32, copy=False))
    else:
        raise ValueError(f"not a plain format: {fmt}")
    return StoredTensor(fmt, tuple(x.shape), {"data": data})


def quantize_fp8(w: np.ndarray) -> StoredTensor:
    """Per-output-channel e4m3: scale[n] = max|w[n]| / 448."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError("fp8 quantisation needs a 2-D [N, K] weight")
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    data = e4m3_encode(w / scale[:, None])
    return StoredTensor("fp8", tuple(w.shape), {"data": data, "scale": scale})


def quantize_nvfp4(w: np.ndarray) -> StoredTensor:
    """Two-level NVFP4: block-16 e4m3 scales under one fp32 global scale.

    global = amax(w) / (448 * 6) so every block scale amax_b / 6 / global fits e4m3; each value
    rounds to the nearest e2m1 magnitude of w / (e4m3(scale_b) * global).
    """
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % NVFP4_BLOCK:
        raise ValueError(f"nvfp4 needs a 2-D weight with K a multiple of {NVFP4_BLOCK}")
    n, k = w.shape
    amax = float(np.abs(w).max())
    global_scale = np.float32(amax / (FP8_MAX * 6.0) if amax > 0 else 1.0)
    blocks = w.reshape(n, k // NVFP4_BLOCK, NVFP4_BLOCK)
    block_scale = np.abs(blocks).max(axis=2) / 6.0 / global_scale
    scale_bits = e4m3_encode(block_scale)
    eff = e4m3_decode(scale_bits) * global_scale  # [n, k/16]
    safe = np.where(eff > 0, eff, 1.0)[:, :, None]
    q = blocks / safe
    mags = E2M1_VALUES[:8]
    # nearest magnitude; an exact tie goes to the smaller magnitude
    idx = np.abs(np.abs(q)[..., None] - mags).argmin(axis=-1).astype(np.uint8)
    codes = idx | np.where(q < 0, 8, 0).astype(np.uint8)
    codes = codes.reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return StoredTensor(
        "nvfp4",
        (n, k),
        {"data": packed, "scale": scale_bits, "global_scale": np.array([global_scale], np.float32)},
    )


def quantize(w: np.ndarray, fmt: str) -> StoredTensor:
    """Store `w` in weight format `fmt` (bf16 | fp8 | nvfp4 | f32 | f16)."""
    if fmt == "fp8":
        return quantize_fp8(w)
    if fmt == "nvfp4":
        return quantize_nvfp4(w)
    return plain(w, fmt)


# -- dequantisers ----------------------------------------------------------------------------


def dequantize(t: StoredTensor) -> np.ndarray:
    """Reference float32 value of a stored tensor (its logical shape)."""
    fmt = t.format
    data = t.parts["data"]
    if fmt == "f32":
        return np.asarray(data, dtype=np.float32)
    if fmt == "f16":
        return data.astype(np.float32)
    if fmt == "bf16":
        return bf16_decode(data)
    if fmt == "fp8":
        return e4m3_decode(data) * t.parts["scale"][:, None]
    if fmt == "nvfp4":
        n, k = t.shape
        codes = np.empty((n, k), np.uint8)
        codes[:, 0::2] = data & 0xF
        codes[:, 1::2] = data >> 4
        scale = e4m3_decode(t.parts["scale"]) * t.parts["global_scale"][0]
        return (
            E2M1_VALUES[codes].reshape(n, k // NVFP4_BLOCK, NVFP4_BLOCK) * scale[:, :, None]
        ).reshape(n, k)
    if fmt.startswith("gguf:"):
        return dequantize_blocks(data, fmt.split(":", 1)[1], t.shape)
    raise ConvertError(f"unknown storage format {fmt!r}")

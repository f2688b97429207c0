"""Exact dequantisers for the GGML block formats an artifact may keep packed (`gguf:<TYPE>`).

Each format stores a row of K values as K / block_elements blocks of block_bytes bytes
(little-endian, as llama.cpp's ggml-common.h lays them out):

| type | elems | bytes | block layout                                   | value of element i            |
| ---- | ----- | ----- | ---------------------------------------------- | ----------------------------- |
| Q4_0 | 32    | 18    | d f16, qs[16] (i < 16 low nibble, else high)   | d * (q - 8)                   |
| Q4_1 | 32    | 20    | d f16, m f16, qs[16]                           | d * q + m                     |
| Q5_0 | 32    | 22    | d f16, qh u32 (bit i = 5th bit), qs[16]        | d * (q - 16)                  |
| Q5_1 | 32    | 24    | d f16, m f16, qh u32, qs[16]                   | d * q + m                     |
| Q8_0 | 32    | 34    | d f16, q int8[32]                              | q * d                         |
| Q4_K | 256   | 144   | d, dmin f16, 8 x (6-bit scale, 6-bit min) in   | (d * sc_s) * q - dmin * m_s   |
|      |       |       | 12 bytes, qs[128] (4 chunks of 32 bytes: low   | (s = i // 32 sub-block)       |
|      |       |       | nibbles sub-block 2c, high nibbles 2c + 1)     |                               |
| Q5_K | 256   | 176   | as Q4_K plus qh[32] before qs (bit s of qh[l]  | (d * sc_s) * q - dmin * m_s   |
|      |       |       | is the 5th bit of element 32 s + l)            |                               |
| Q6_K | 256   | 210   | ql[128], qh[64], scales int8[16], d f16        | (d * sc_(i//16)) * (q - 32)   |

The arithmetic is float32 in the order the last column gives, which is the order of llama.cpp's
reference `dequantize_row_*` and of the `gguf` package, so the result is bit-for-bit theirs (the
tests compare them on random blocks). numpy only: the artifact layer never needs torch for this.
"""

from __future__ import annotations

import numpy as np

from ninfer.errors import ConvertError

QK = 32  # elements of a legacy block
QK_K = 256  # elements of a K-quant super-block

# type -> (elements per block, bytes per block)
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    "Q4_0": (QK, 18),
    "Q4_1": (QK, 20),
    "Q5_0": (QK, 22),
    "Q5_1": (QK, 24),
    "Q8_0": (QK, 34),
    "Q4_K": (QK_K, 144),
    "Q5_K": (QK_K, 176),
    "Q6_K": (QK_K, 210),
}
BLOCK_TYPES = tuple(BLOCK_SIZES)


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> [n, 1] float32 (little-endian f16)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] values: the 16 low nibbles, then the 16 high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes (a little-endian u32) -> [n, 32] of bit i << 4."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")
    return bits << 4


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:20]).astype(np.float32) + m


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 6:22]) | _fifth_bits(b[:, 2:6])).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:24]) | _fifth_bits(b[:, 4:8])
    return d * q.astype(np.float32) + m


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    return np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32) * d


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes [n, 12] -> (scale, min) [n, 8] as 6-bit integers.

    Sub-blocks 0-3: low 6 bits of bytes 0-3 (scales) and 4-7 (mins). Sub-blocks 4-7: the low /
    high nibble of bytes 8-11 for the low four bits, the top two bits of bytes 0-3 / 4-7 above.
    """
    lo_s, lo_m, mix = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_s & 0x3F, (mix & 0x0F) | ((lo_s >> 6) << 4)], axis=1)
    mn = np.concatenate([lo_m & 0x3F, (mix >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc, mn


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: chunk c's low nibbles are sub-block 2c, high ones 2c + 1."""
    chunks = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k_like(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(d * sc) * q - dmin * m over 8 sub-blocks of 32; q: [n, 8, 32] unsigned."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    scale = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * mn.astype(np.float32))[:, :, None]
    return (scale * q.astype(np.float32) - offset).reshape(-1, QK_K)


def _q4_k(b: np.ndarray) -> np.ndarray:
    return _q4_k_like(b, _k_nibbles(b[:, 16:144]))


def _q5_k(b: np.ndarray) -> np.ndarray:
    qh = b[:, 16:48]  # [n, 32]: bit s of byte l -> element 32 s + l
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return _q4_k_like(b, _k_nibbles(b[:, 48:176]) | (high << 4))


def _q6_k(b: np.ndarray) -> np.ndarray:
    """Two halves of 128: ql byte l of a half (64 bytes) holds element l (low nibble) and
    64 + l (high); qh byte l (32 bytes) holds the top two bits of elements l, 32+l, 64+l, 96+l."""
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 64)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 128)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    high = ((qh >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3).reshape(n, 2, 128)
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)  # [n, 2, 128]
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)  # [n, 16]
    d = _f16(b[:, 208:210])
    scale = (d * sc)[:, :, None]  # [n, 16, 1]: one per 16 elements
    return (scale * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


_DEQUANTISERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


def row_bytes(type_name: str, k: int) -> int:
    """Bytes of one row of k values in `type_name` (k must be a whole number of blocks)."""
    elems, size = BLOCK_SIZES[type_name]
    if k % elems:
        raise ConvertError(f"a {type_name} row needs a multiple of {elems} values, got {k}")
    return k // elems * size


def dequantize_blocks(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of shape `shape` from GGML blocks `data` (uint8, any shape whose bytes are
    the rows of `shape` back to back)."""
    if type_name not in _DEQUANTISERS:
        raise ConvertError(
            f"unsupported GGML block type {type_name} (supported: {', '.join(BLOCK_TYPES)})"
        )
    elems, size = BLOCK_SIZES[type_name]
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    count = int(np.prod(shape, dtype=np.int64))
    if count % elems or raw.size != count // elems * size:
        raise ConvertError(
            f"{raw.size} bytes of {type_name} blocks do not hold a tensor of shape {list(shape)}"
        )
    return _DEQUANTISERS[type_name](raw.reshape(-1, size)).reshape(shape)

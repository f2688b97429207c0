"""CPU weight-only GEMMs for GGUF block formats, on torch's int4 packed kernel.

A GGUF Q4_0 / Q4_1 / Q8_0 weight [N, K] (blocks of 32 values along K) stays packed at 4 bits
per value, in the layout `torch.ops.aten._weight_int4pack_mm_for_cpu` reads, instead of being
expanded to float32 (8x the bytes streamed per decode token). That kernel computes, per group
g of 32 values along K and output row n,

    w[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n]      q in 0..15

with bf16 x, scale and zero, fp32 accumulation and a bf16 result. Each block format maps onto
it without re-quantising the values (block = group):

    Q4_0  w = d (q - 8)          scale = d,  zero = 0
    Q4_1  w = d q + m            scale = d,  zero = m + 8 d
    Q8_0  w = d q, q in -128..127: with u = q + 128 = 16 h + l (h, l in 0..15),
          w = 16 d (h - 8) + [d (l - 8) + 8 d]: two 4-bit planes side by side along K
          [hi | lo] (scale 16 d, zero 0 | scale d, zero 8 d), and x repeated [x | x]

What is not exact against the float32 dequantised weights (the reference):
    x rounded to bf16 (relative 2^-9 per element), scale and zero rounded from f16 to bf16
    (relative 2^-9 of d, m + 8 d), the product rounded to bf16 (relative 2^-9 of each output);
    sums in fp32 in the kernel's order. So |y - y_ref| <= ~3 * 2^-9 * sum_k |w[n,k] x[k]| plus
    fp32 rounding: a bf16 GEMM's error, not a re-quantisation's. float32 reference numerics
    come from dequantised weights (`cpu_weights="float32"`), never from this path.

The lm_head (`logits`) does not take this path: a bf16 result keeps 8 significant bits, so a
logit of 25 would be rounded to a multiple of 0.125, enough to swap two near-tied tokens (the
demo's first answer token to "What is the capital of France?" is such a tie, 0.08 apart). It
runs `half_logits`: the dequantised weight in f16 (a 2^-11 relative rounding of a value that
was already 4- or 8-bit quantised), x in f16, fp32 accumulation, an f16 result (0.0078 at 25):
|y - y_ref| <= ~3 * 2^-11 * sum_k |w[n,k] x[k]|, at half the bytes of float32.

Kernel names, as the plan prints them: `cpu.q4_0_int4pack`, `cpu.q4_1_int4pack`,
`cpu.q8_0_int4pack` (GEMMs, `int4pack_linear`), `cpu.logits_f16` (`half_logits`) and
`cpu.gguf_rows` (an embedding lookup that dequantises only the rows it reads, exactly as the
reference does, `gguf_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

GROUP = 32  # GGUF block = int4pack group
# bytes per 32-value block: f16 d (+ f16 m for Q4_1), then the values (16 bytes of nibbles or
# 32 int8). Spelled here, not read from the gguf package: kernels import torch and triton only
# (the CUDA machine has no gguf); tests check these against gguf's GGML_QUANT_SIZES.
BLOCK_BYTES = {"gguf:Q4_0": 2 + 16, "gguf:Q4_1": 2 + 2 + 16, "gguf:Q8_0": 2 + 32}
PACKED_FORMATS = tuple(BLOCK_BYTES)


@dataclass
class PackedWeight:
    """A [N, K] GGUF weight in the forms its CPU kernels read: torch's int4 layout (GEMMs), an
    f16 copy (the lm_head) and its raw blocks (exact embedding rows); each only where read.

    packed: `_convert_weight_to_int4pack_for_cpu` of the [N, K * planes] 4-bit codes
    scale_zeros: bf16 [K * planes / 32, N', 2], N' = N rounded up to 16 (zero rows)
    planes: 1 (Q4_0, Q4_1) or 2 (Q8_0: x is repeated along K)
    blocks: uint8 [N, K / 32 * block bytes], or None when no embedding reads this weight
    half: f16 [N, K] (the dequantised values rounded to f16), or None when no lm_head reads it
    """

    fmt: str
    shape: tuple[int, int]
    packed: torch.Tensor | None
    scale_zeros: torch.Tensor | None
    planes: int
    blocks: torch.Tensor | None = None
    half: torch.Tensor | None = None

    def nbytes(self) -> int:
        """Host bytes held (packed codes, scales, raw blocks, f16 copy)."""
        ts = (self.packed, self.scale_zeros, self.blocks, self.half)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """float32 [N, B] of the f16 at byte `at` of every block (blocks: uint8 [N, B, bytes])."""
    return (
        np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0].astype(np.float32)
    )


def _codes(fmt: str, raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-bit codes int32 [N, K * planes] and f32 scale, zero [N, K * planes / 32] of one
    weight's raw blocks uint8 [N, K / 32 * block bytes]."""
    n = raw.shape[0]
    b = raw.reshape(n, k // GROUP, BLOCK_BYTES[fmt])
    d = _f16(b, 0)
    if fmt == "gguf:Q8_0":
        u = (b[..., 2:].view(np.int8).astype(np.int32) + 128).reshape(n, k)
        codes = np.concatenate([u >> 4, u & 15], axis=1)
        scale = np.concatenate([16.0 * d, d], axis=1)
        zero = np.concatenate([np.zeros_like(d), 8.0 * d], axis=1)
        return codes, scale, zero
    qs = b[..., 4:] if fmt == "gguf:Q4_1" else b[..., 2:]  # [N, B, 16]
    # element j of a block in the low nibble of byte j, element j + 16 in its high nibble
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int32).reshape(n, k)
    if fmt == "gguf:Q4_1":
        return codes, d, _f16(b, 2) + 8.0 * d
    return codes, d, np.zeros_like(d)


def pack_gguf(
    fmt: str,
    raws: list[np.ndarray],
    k: int,
    *,
    gemm: bool = True,
    rows: bool = False,
    half: bool = False,
) -> PackedWeight:
    """Pack GGUF weights `raws` (uint8 [N_i, K / 32 * block bytes], concatenated along N, as a
    fused GEMM's sources are) of format `fmt` (gguf:Q4_0 | gguf:Q4_1 | gguf:Q8_0).
    `gemm`: build the int4 layout; `rows`: keep the raw blocks for `gguf_rows`; `half`: keep
    an f16 copy for `half_logits`."""
    if fmt not in BLOCK_BYTES:
        raise ValueError(f"no CPU int4pack kernel for format {fmt!r} (have {PACKED_FORMATS})")
    if k % GROUP:
        raise ValueError(f"{fmt}: K = {k} is not a multiple of the block size {GROUP}")
    raw = np.concatenate([np.asarray(r, dtype=np.uint8).reshape(r.shape[0], -1) for r in raws])
    n = raw.shape[0]
    if raw.shape[1] != k // GROUP * BLOCK_BYTES[fmt]:
        raise ValueError(f"{fmt}: rows of {raw.shape[1]} bytes do not hold K = {k} values")
    packed = scale_zeros = None
    planes = 2 if fmt == "gguf:Q8_0" else 1
    if gemm:
        codes, scale, zero = _codes(fmt, raw, k)
        pad = -n % 16  # the packing wants N in multiples of 16: zero rows (scale 0, zero 0)
        if pad:
            codes = np.pad(codes, ((0, pad), (0, 0)))
            scale, zero = np.pad(scale, ((0, pad), (0, 0))), np.pad(zero, ((0, pad), (0, 0)))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1)
        # [G, N, 2] (scale, zero) per group and output row
        sz = np.stack([scale.T, zero.T], axis=-1)
        scale_zeros = torch.from_numpy(np.ascontiguousarray(sz)).to(torch.bfloat16)
    blocks = torch.from_numpy(raw.copy())
    dense = dequantize_blocks(fmt, blocks).half() if half else None
    return PackedWeight(fmt, (n, k), packed, scale_zeros, planes, blocks if rows else None, dense)


def int4pack_linear(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """y = x @ W^T for x [T, K] (any float dtype) -> [T, N] in x.dtype, W the packed weight
    (bf16 inputs and result, fp32 accumulation: the error bound is in the module docstring)."""
    if w.packed is None or w.scale_zeros is None:
        raise ValueError(f"{w.fmt} weight {w.shape} was loaded without its GEMM layout")
    xb = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    if w.planes == 2:
        xb = torch.cat([xb, xb], dim=-1)  # [T, 2K]: the hi plane, then the lo plane
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, w.packed, GROUP, w.scale_zeros)
    if y.shape[-1] != w.shape[0]:
        y = y[:, : w.shape[0]]  # the padding rows
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])


def half_logits(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """float32 logits x @ W^T [T, N] from the f16 copy of W (error bound in the module
    docstring). Where an f16 operand or result would overflow (|x| or |y| beyond 65504), the
    product is redone with x scaled by 2^-16 (exact) and the result scaled back in fp32."""
    if w.half is None:
        raise ValueError(f"{w.fmt} weight {w.shape} was loaded without its f16 copy")
    y = F.linear(x.to(torch.float16), w.half).float()
    if not torch.isfinite(y).all():
        y = F.linear((x.float() * 2.0**-16).to(torch.float16), w.half).float() * 2.0**16
    return y


def dequantize_blocks(fmt: str, blocks: torch.Tensor) -> torch.Tensor:
    """float32 [R, K] of raw GGUF rows uint8 [R, K / 32 * block bytes], with the reference
    dequantiser's float operations (gguf.quants: f16 d to f32, d * q, + m for Q4_1)."""
    r = blocks.shape[0]
    b = blocks.reshape(r, -1, BLOCK_BYTES[fmt])  # [R, B, bytes]
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # [R, B, 1]
    if fmt == "gguf:Q8_0":
        return (d * b[..., 2:].contiguous().view(torch.int8).float()).reshape(r, -1)
    qs = b[..., 4:] if fmt == "gguf:Q4_1" else b[..., 2:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # [R, B, 32]
    if fmt == "gguf:Q4_1":
        m = b[..., 2:4].contiguous().view(torch.float16).float()
        return (d * q + m).reshape(r, -1)
    return (d * (q - 8.0)).reshape(r, -1)


def gguf_rows(ids: torch.Tensor, w: PackedWeight, dtype: torch.dtype) -> torch.Tensor:
    """Embedding lookup [*ids.shape, K] in `dtype`: only the rows `ids` are dequantised, with
    the same float32 values as the dequantised table (exact)."""
    if w.blocks is None:
        raise ValueError(f"{w.fmt} weight {w.shape} was loaded without its raw rows")
    flat = ids.reshape(-1).long()
    return dequantize_blocks(w.fmt, w.blocks[flat]).to(dtype).reshape(*ids.shape, w.shape[1])

"""NVFP4 weights in the word layout of the tensor-core decode GEMV (kernels/fp8_mma.py).

The stored layout (kernels/quant_gemm.py: two e2m1 per byte, element 2i in the low nibble) needs
15 integer ops per 32-bit word to become the four f16 pairs an MMA takes (each pair needs its
magnitudes and its signs shifted by different amounts: kernels/nvfp4_words.py). At load time the
CUDA runtime rewrites each word of 8 values so that pair k (elements 2k, 2k + 1, in the low / high
16 bits) comes out of 1-3 ops. Per 16-bit half, element 2k + h of the word keeps its magnitude
bits (m, e0, e1) and its sign at:

    pair 0   magnitude 9..11, sign 15    f16 bits as they are        w & M
    pair 1   magnitude 6..8,  sign 12    both 3 below                (w << 3) & M
    pair 2   magnitude 3..5,  sign 14    6 and 1 below               ((w & 0x40384038) * 66) & M
    pair 3   magnitude 0..2,  sign 13    9 and 2 below               ((w & 0x20072007) * 516) & M

with M = 0x8E008E00: the pair as f16 bits (s << 15) | (eem << 9), which read as e2m1 * 2^-14
exactly (0.5 is the f16 subnormal 2^-15). The multiplies add two shifted copies whose other bits
never reach M (checked for every word in tests/kernels/test_nvfp4_mma.py). 9 ops per word
against 15, and the pairs come out in K order, so x needs no permutation either.

The block scales stay e4m3 bytes (one ``cvt.rn.f16x2.e4m3x2`` gives a thread's two); a block's
values times its scale are exact in f16 (e2m1 * e4m3 * 2^-14 lies in [2^-24, 2688 * 2^-14] and
has at most 6 significant bits), and the row scale (the global scale, times 2^14) multiplies
each row's fp32 sum once at the end. The repacked words are a second copy of the weight (the
prefill and batch > 1 kernels read the stored layout): 0.5 bytes per value, plus 4 per row,
more on the device (NINFER_NVFP4_MMA=0 leaves it out; the plan's memory ledger counts it:
ninfer/passes/plan_memory.py, where its size is computed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.quant_decode import fp8_bytes

MASK = 0x8E008E00
_MASK = tl.constexpr(MASK)
# per pair k: (lowest magnitude bit, sign bit) of an element inside its 16-bit half
PLACES = ((9, 15), (6, 12), (3, 14), (0, 13))
DECODE_SCALE = 16384.0  # the decoded values are e2m1 * 2^-14


@dataclass(frozen=True)
class Nvfp4MmaWeight:
    """An nvfp4 weight [N, K] for the tensor-core GEMV: words int32 [N, K/8] in the layout
    above, block scales [N, K/16] e4m3 bytes (read as uint16 pairs; the stored weight's tensor),
    row_scale fp32 [N] = the global scale (per row) * DECODE_SCALE."""

    words: torch.Tensor
    block_scale: torch.Tensor
    row_scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.words.shape[0], self.words.shape[1] * 8

    def nbytes(self) -> int:
        """Device memory of the copy (the block scales are the stored weight's, not copied)."""
        return self.words.numel() * 4 + self.row_scale.numel() * 4


def repack_words(packed: torch.Tensor) -> torch.Tensor:
    """Stored e2m1 bytes [N, K/2] (uint8, K % 8 == 0) -> int32 words [N, K/8] in the layout of
    the module docstring (on packed's device)."""
    N, half = packed.shape
    assert packed.dtype == torch.uint8 and half % 4 == 0, (packed.dtype, packed.shape)
    b = packed.to(torch.int64).view(N, half // 4, 4)
    word = torch.zeros((N, half // 4), dtype=torch.int64, device=packed.device)
    for e in range(8):  # element e of the word: byte e // 2, high nibble for odd e
        nib = (b[..., e // 2] >> (4 * (e % 2))) & 0xF
        lo, sign = PLACES[e // 2]
        base = 16 * (e % 2)
        word |= ((nib & 7) << (base + lo)) | ((nib >> 3) << (base + sign))
    return (word - ((word >> 31) << 32)).to(torch.int32)  # two's complement


def unpack_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of repack_words: int32 [N, K/8] -> stored e2m1 bytes [N, K/2]."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    N, nw = w.shape
    out = torch.zeros((N, nw, 4), dtype=torch.int64, device=words.device)
    for e in range(8):
        lo, sign = PLACES[e // 2]
        base = 16 * (e % 2)
        nib = ((w >> (base + lo)) & 7) | (((w >> (base + sign)) & 1) << 3)
        out[..., e // 2] |= nib << (4 * (e % 2))
    return out.to(torch.uint8).view(N, nw * 4)


def prepare(
    packed: torch.Tensor, scale: torch.Tensor, global_scale: float | torch.Tensor
) -> Nvfp4MmaWeight:
    """The tensor-core GEMV's copy of a stored nvfp4 weight (packed [N, K/2] uint8, scale
    [N, K/16] e4m3, global scale a float or fp32 [N])."""
    N = packed.shape[0]
    if isinstance(global_scale, torch.Tensor) and global_scale.numel() == N and N > 1:
        rs = global_scale.reshape(N).to(device=packed.device, dtype=torch.float32)
    else:
        rs = torch.full((N,), float(global_scale), dtype=torch.float32, device=packed.device)
    return Nvfp4MmaWeight(
        repack_words(packed), fp8_bytes(scale).contiguous(), (rs * DECODE_SCALE).contiguous()
    )


# one repacked word + the f16 pair (s, s) of its block scale -> the four f16 pairs (elements
# 2k, 2k + 1) of e2m1 * s * 2^-14 (exact)
_DECODE_ASM = tl.constexpr(
    """
{
.reg .b32 t;
and.b32 t, $4, 0x8E008E00;
mul.rn.f16x2 $0, t, $5;
shl.b32 t, $4, 3;
and.b32 t, t, 0x8E008E00;
mul.rn.f16x2 $1, t, $5;
and.b32 t, $4, 0x40384038;
mul.lo.u32 t, t, 66;
and.b32 t, t, 0x8E008E00;
mul.rn.f16x2 $2, t, $5;
and.b32 t, $4, 0x20072007;
mul.lo.u32 t, t, 516;
and.b32 t, t, 0x8E008E00;
mul.rn.f16x2 $3, t, $5;
}
"""
)


@triton.jit
def decode_scaled(w, s2):
    """Repacked words (int32) and f16 pairs (s, s) -> four int32 f16 pairs in K order."""
    return tl.inline_asm_elementwise(
        _DECODE_ASM, "=r,=r,=r,=r,r,r", [w, s2], dtype=(tl.int32,) * 4, is_pure=True, pack=1
    )


# a thread's two e4m3 block scales (one uint16, first block low) -> f16 pairs (s0, s0), (s1, s1)
_SCALES_ASM = tl.constexpr(
    """
{
.reg .b16 h;
.reg .b32 f;
cvt.u16.u32 h, $2;
cvt.rn.f16x2.e4m3x2 f, h;
prmt.b32 $0, f, f, 0x1010;
prmt.b32 $1, f, f, 0x3232;
}
"""
)


@triton.jit
def scale_pairs(pair):
    return tl.inline_asm_elementwise(
        _SCALES_ASM, "=r,=r,r", [pair.to(tl.int32)], dtype=(tl.int32, tl.int32), is_pure=True,
        pack=1,
    )  # fmt: skip


@triton.jit
def _f16_value(bits):
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def word_values(w):
    """Repacked words (int32) -> their 8 values * 2^-14 as fp32, in K order (portable ops: the
    fp32 path and the interpreter)."""
    u = w.to(tl.uint32, bitcast=True)
    p0 = u & _MASK
    p1 = (u << 3) & _MASK
    p2 = ((u & 0x40384038) * 66) & _MASK
    p3 = ((u & 0x20072007) * 516) & _MASK
    return (
        _f16_value(p0 & 0xFFFF), _f16_value(p0 >> 16), _f16_value(p1 & 0xFFFF),
        _f16_value(p1 >> 16), _f16_value(p2 & 0xFFFF), _f16_value(p2 >> 16),
        _f16_value(p3 & 0xFFFF), _f16_value(p3 >> 16),
    )  # fmt: skip

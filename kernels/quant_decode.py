"""Bit-exact decoding of the 8- and 4-bit float formats, in Triton and in torch.

Formats (storage is always raw bytes, ``torch.uint8``, so the same code runs under the Triton
interpreter, which has no float8 type):

- fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448; 0x7F/0xFF are NaN (never
  written by our quantisers).
- e2m1 (the element type of NVFP4): 1 sign (bit 3), 2 exponent, 1 mantissa bit; magnitudes
  {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Two elements per byte: element 2i in the low nibble.

Both decoders move the bits into an fp16 pattern and rescale by a power of two: the exponent
biases differ by a constant and fp16 keeps the subnormals, so the result is exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP8_E4M3_MAX = 448.0
E2M1_MAX = 6.0


@triton.jit
def fp8e4m3_to_f32(b):
    """b: int32 tensor of byte values 0..255 -> float32 values of the e4m3fn bytes."""
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0


@triton.jit
def fp8_raw_to_f32(raw, HW: tl.constexpr):
    """raw: uint8 tensor of e4m3fn bytes -> float32. HW: use the hardware float8 conversion
    (CUDA; not available in the interpreter) instead of the bit trick."""
    if HW:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return fp8e4m3_to_f32(raw.to(tl.int32))


@triton.jit
def e2m1_to_f32(n):
    """n: int32 tensor of nibble values 0..15 -> float32 values of the e2m1 nibbles."""
    bits = ((n & 8) << 12) | ((n & 7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 16384.0


# Four packed bytes (8 e2m1 nibbles) -> e4m3 bytes of the low and the high nibbles, then the
# hardware e4m3x2 -> f16x2 conversion (sm_89+). e2m1 (s, e1 e0, m) placed as e4m3 (s, 0 0 e1 e0,
# m 0 0) keeps its bits and subnormals, and reads as value · 2^-6, so the results are e2m1 / 64.
_E2M1X8_TO_F16_ASM = tl.constexpr(
    """
{
.reg .b32 t, u, l, h;
.reg .b16 l0, l1, h0, h1;
shl.b32 t, $4, 4;
shl.b32 u, $4, 2;
and.b32 t, t, 0x80808080;
and.b32 u, u, 0x1C1C1C1C;
or.b32 l, t, u;
shr.b32 u, $4, 2;
and.b32 t, $4, 0x80808080;
and.b32 u, u, 0x1C1C1C1C;
or.b32 h, t, u;
mov.b32 {l0, l1}, l;
mov.b32 {h0, h1}, h;
cvt.rn.f16x2.e4m3x2 $0, l0;
cvt.rn.f16x2.e4m3x2 $1, l1;
cvt.rn.f16x2.e4m3x2 $2, h0;
cvt.rn.f16x2.e4m3x2 $3, h1;
}
"""
)


@triton.jit
def e2m1_pairs_to_f32(raw, HW: tl.constexpr):
    """raw: uint8 tensor of packed e2m1 pairs -> (low nibbles, high nibbles) as float32
    **divided by 64** (exact). HW: decode four bytes at a time with the hardware e4m3
    conversion (CUDA sm_89+, inline PTX); else the portable bit trick (interpreter)."""
    if HW:
        lo, hi = tl.inline_asm_elementwise(
            _E2M1X8_TO_F16_ASM,
            "=r,=r,=r,=r,r",
            [raw],
            dtype=(tl.float16, tl.float16),
            is_pure=True,
            pack=4,
        )
        return lo.to(tl.float32), hi.to(tl.float32)
    else:
        b = raw.to(tl.int32)
        return e2m1_to_f32(b & 0xF) * 0.015625, e2m1_to_f32(b >> 4) * 0.015625


def fp8_bytes(t: torch.Tensor) -> torch.Tensor:
    """View a float8_e4m3fn (or uint8) tensor as its raw bytes (uint8), no copy."""
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise TypeError(f"expected float8_e4m3fn or uint8 bytes, got {t.dtype}")
    return t


def decode_fp8(t: torch.Tensor) -> torch.Tensor:
    """Reference: e4m3fn bytes (uint8 or float8_e4m3fn) -> float32, same shape."""
    return fp8_bytes(t).view(torch.float8_e4m3fn).to(torch.float32)


def encode_fp8(x: torch.Tensor) -> torch.Tensor:
    """Reference: float -> e4m3fn bytes (uint8), round to nearest even, saturated at ±448."""
    x = x.to(torch.float32).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return x.to(torch.float8_e4m3fn).view(torch.uint8)


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Reference: packed e2m1 bytes [..., K/2] (uint8) -> float32 [..., K]."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=packed.device)
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    out = torch.stack([table[lo], table[hi]], dim=-1)  # [..., K/2, 2]
    return out.flatten(-2)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Reference: float [..., K] (already divided by its scale, |x| <= 6) -> packed bytes
    [..., K/2] uint8, round to the nearest e2m1 value (ties to the even code)."""
    mags = torch.tensor(E2M1_VALUES, device=x.device)
    a = x.to(torch.float32).abs().clamp(max=E2M1_MAX)
    # nearest magnitude; on a tie argmin takes the lower index, which is the even mantissa
    # for all ties except 2.5 (between codes 4 and 5) and 5 (6 and 7): pick the even code.
    dist = (a.unsqueeze(-1) - mags).abs()  # [..., K, 8]
    code = dist.argmin(dim=-1)
    tie = dist.topk(2, dim=-1, largest=False).values.diff(dim=-1).squeeze(-1) == 0
    code = torch.where(tie & (code % 2 == 1), code + 1, code)
    code = code | ((x < 0).long() << 3)
    code = code.to(torch.uint8).unflatten(-1, (-1, 2))
    return code[..., 0] | (code[..., 1] << 4)

"""The Triton pieces of kernels/nvfp4_gemv.py's decode GEMV: e2m1 words decoded eight values at
a time (into fp16 for the FMA variant, into bf16 times the block scale for the tensor-core
variant), the per-chunk arithmetic of both variants, the chunk loads and the row stores. See
kernels/nvfp4_gemv.py for the layout and the reasoning."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.launch import WEIGHT_EVICT
from kernels.quant_decode import fp8_raw_to_f32

# One word of 8 e2m1 nibbles (element j in bits 4j..4j+3) -> its 8 values * 2^-14 as fp32, in K
# order ($0..$7). Each lop3 computes (a | b) & 0x8E008E00 (LUT 0xA8): the two shifted copies of
# the isolated nibbles carry the sign to bit 15 / 31 and the magnitude to bits 9..11 / 25..27.
# The left shifts are multiplies by $9..$14 = 2^9, 2^12, 2, 2^4, 2^5, 2^8 held in registers:
# ptxas cannot see they are powers of two, so they run as IMAD on the FMA pipe instead of SHF on
# the half-rate integer pipe, which the lop3s, the x conversions and the loop already load.
_E2M1X8_ASM = tl.constexpr(
    """
{
.reg .b32 u, v, a, b, p;
.reg .b16 l, h;
and.b32 u, $8, 0x0F0F0F0F;
and.b32 v, $8, 0xF0F0F0F0;
mul.lo.u32 a, u, $9;
mul.lo.u32 b, u, $10;
lop3.b32 p, a, b, 0x8E008E00, 0xA8;
mov.b32 {l, h}, p;
cvt.f32.f16 $0, l;
cvt.f32.f16 $4, h;
mul.lo.u32 a, u, $11;
mul.lo.u32 b, u, $12;
lop3.b32 p, a, b, 0x8E008E00, 0xA8;
mov.b32 {l, h}, p;
cvt.f32.f16 $2, l;
cvt.f32.f16 $6, h;
mul.lo.u32 a, v, $13;
mul.lo.u32 b, v, $14;
lop3.b32 p, a, b, 0x8E008E00, 0xA8;
mov.b32 {l, h}, p;
cvt.f32.f16 $1, l;
cvt.f32.f16 $5, h;
shr.b32 a, v, 3;
lop3.b32 p, a, v, 0x8E008E00, 0xA8;
mov.b32 {l, h}, p;
cvt.f32.f16 $3, l;
cvt.f32.f16 $7, h;
}
"""
)


@triton.jit
def _f16_lanes(p):
    """fp16x2 bit patterns (uint32) -> (low lane, high lane) as fp32."""
    lo = (p & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _decode8(w, one, HW: tl.constexpr):
    """w: uint32 words of 8 e2m1 nibbles -> the 8 values * 2^-14 (fp32, exact), in K order.
    one: a uint32 1 the compiler cannot fold (see _E2M1X8_ASM)."""
    if HW:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _E2M1X8_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r",
            [w, one << 9, one << 12, one << 1, one << 4, one << 5, one << 8],
            dtype=(tl.float32,) * 8, is_pure=True, pack=1,
        )  # fmt: skip
    else:  # the same integer ops, portable (interpreter)
        u = w & 0x0F0F0F0F
        v = w & 0xF0F0F0F0
        v0, v4 = _f16_lanes(((u << 9) | (u << 12)) & 0x8E008E00)
        v2, v6 = _f16_lanes(((u << 1) | (u << 4)) & 0x8E008E00)
        v1, v5 = _f16_lanes(((v << 5) | (v << 8)) & 0x8E008E00)
        v3, v7 = _f16_lanes(((v >> 3) | v) & 0x8E008E00)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _split8(x):
    """x [R, 8] -> its 8 columns, each [R] (in-thread: a register renaming)."""
    R: tl.constexpr = x.shape[0]
    a, b = tl.split(tl.permute(tl.reshape(x, [R, 2, 4]), (0, 2, 1)))  # columns 0..3 / 4..7
    a0, a1 = tl.split(tl.permute(tl.reshape(a, [R, 2, 2]), (0, 2, 1)))  # (0, 1) / (2, 3)
    b0, b1 = tl.split(tl.permute(tl.reshape(b, [R, 2, 2]), (0, 2, 1)))
    x0, x1 = tl.split(a0)
    x2, x3 = tl.split(a1)
    x4, x5 = tl.split(b0)
    x6, x7 = tl.split(b1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _bf16_pair(p):
    """uint32 holding two bf16 (element 2i low) -> (even, odd) as fp32: the bits moved, exact."""
    return (p << 16).to(tl.float32, bitcast=True), (p & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _x_word(x_row, kv, xo, xq, K, X32: tl.constexpr, EVEN: tl.constexpr):
    """The 8 x values of each thread's word, the one starting at value kv + xo[:, 0] (zero past
    K), fp32, as 8 [1, R] tensors. xo [R, 8] value offsets; xq [R, 4] the pair offsets, used with
    X32: x is bf16 read as uint32 pairs (x_row an int32 pointer)."""
    if X32:
        kp = kv // 2 + xq
        if EVEN:
            xp = tl.load(x_row + kp)
        else:
            xp = tl.load(x_row + kp, mask=kp < K // 2, other=0)
        xp = xp.to(tl.uint32, bitcast=True)
        pa, pb = tl.split(tl.permute(tl.reshape(xp, [xq.shape[0], 2, 2]), (0, 2, 1)))
        p0, p1 = tl.split(pa)
        p2, p3 = tl.split(pb)
        x0, x1 = _bf16_pair(p0)
        x2, x3 = _bf16_pair(p1)
        x4, x5 = _bf16_pair(p2)
        x6, x7 = _bf16_pair(p3)
    else:
        k = kv + xo
        if EVEN:
            xv = tl.load(x_row + k)
        else:
            xv = tl.load(x_row + k, mask=k < K, other=0.0)
        x0, x1, x2, x3, x4, x5, x6, x7 = _split8(xv.to(tl.float32))
    return (x0[None, :], x1[None, :], x2[None, :], x3[None, :],
            x4[None, :], x5[None, :], x6[None, :], x7[None, :])  # fmt: skip


@triton.jit
def _dot8(bs, v0, v1, v2, v3, v4, v5, v6, v7, x_row, kv, xo, xq, K, FIRST: tl.constexpr,
          X32: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """(bs if not FIRST) + sum_j v_j * x_j: one word's 8 products per weight row, an FMA chain."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _x_word(x_row, kv, xo, xq, K, X32, EVEN)
    if FIRST:
        bs = v0 * x0
    else:
        bs = bs + v0 * x0
    bs = bs + v1 * x1
    bs = bs + v2 * x2
    bs = bs + v3 * x3
    bs = bs + v4 * x4
    bs = bs + v5 * x5
    bs = bs + v6 * x6
    bs = bs + v7 * x7
    return bs


@triton.jit
def _block(acc0, acc1, acc2, acc3, wa, wb, sc, one, x0, x1, x2, x3, kv, xo, xq, K,
           BM: tl.constexpr, X32: tl.constexpr, EVEN: tl.constexpr, HW: tl.constexpr):  # fmt: skip
    """Add one 16-value block (words wa, wb [BN, R]; the first starts at value kv + xo[:, 0])
    times its scale sc [BN, R] to the accumulators of the program's (up to 4) x rows x0..x3."""
    v0, v1, v2, v3, v4, v5, v6, v7 = _decode8(wa, one, HW)
    b0 = _dot8(acc0, v0, v1, v2, v3, v4, v5, v6, v7, x0, kv, xo, xq, K, True, X32, EVEN)
    if BM > 1:
        b1 = _dot8(acc1, v0, v1, v2, v3, v4, v5, v6, v7, x1, kv, xo, xq, K, True, X32, EVEN)
    if BM > 2:
        b2 = _dot8(acc2, v0, v1, v2, v3, v4, v5, v6, v7, x2, kv, xo, xq, K, True, X32, EVEN)
        b3 = _dot8(acc3, v0, v1, v2, v3, v4, v5, v6, v7, x3, kv, xo, xq, K, True, X32, EVEN)
    v0, v1, v2, v3, v4, v5, v6, v7 = _decode8(wb, one, HW)
    kv = kv + 8
    b0 = _dot8(b0, v0, v1, v2, v3, v4, v5, v6, v7, x0, kv, xo, xq, K, False, X32, EVEN)
    acc0 = acc0 + b0 * sc
    if BM > 1:
        b1 = _dot8(b1, v0, v1, v2, v3, v4, v5, v6, v7, x1, kv, xo, xq, K, False, X32, EVEN)
        acc1 = acc1 + b1 * sc
    if BM > 2:
        b2 = _dot8(b2, v0, v1, v2, v3, v4, v5, v6, v7, x2, kv, xo, xq, K, False, X32, EVEN)
        b3 = _dot8(b3, v0, v1, v2, v3, v4, v5, v6, v7, x3, kv, xo, xq, K, False, X32, EVEN)
        acc2 = acc2 + b2 * sc
        acc3 = acc3 + b3 * sc
    return acc0, acc1, acc2, acc3


# -- tensor-core variant (MMA): the FMAs and f16 -> f32 conversions leave the CUDA cores ---------
#
# mma.sync m16n8k16 (bf16 in, fp32 accumulate) run on lane-local data: each lane feeds its own
# weights (two rows a, b: A rows g and g + 8 of its quad g = lane / 4) and its own x values (B
# column g); D[g][g] and D[g + 8][g] then sum the products of quad g's four lanes for rows a and
# b, and the other D entries are unused cross products. Only which lane holds which K group
# changes nothing (every lane holds all BN rows, and the result is summed over lanes). Weights
# are bf16 with the block scale applied (exact: e2m1 * e4m3 has at most 6 significant bits), x
# must be bf16 (X32). Per word: 15 integer ops, 4 bf16x2 multiplies, 1 HMMA.

# word + bf16x2 (s, s), s = e4m3 scale * 2^118 -> 4 bf16x2: nibbles (0, 4), (2, 6), (1, 5), (3, 7)
# as e2m1 * s * 2^-126 (the nibble bits placed as (s << 15) | (eem << 6): e2m1 * 2^-126, with
# 0.5 a bf16 subnormal; the product is a normal bf16 >= 2^-18). Shifts by 6, 12, 2, 8, 4 are
# multiplies by $6..$10 (see _E2M1X8_ASM).
_E2M1X8_BF16_ASM = tl.constexpr(
    """
{
.reg .b32 x, a, b, p;
and.b32 x, $4, 0x000F000F;
mul.lo.u32 a, x, $6;
mul.lo.u32 b, x, $7;
lop3.b32 p, a, b, 0x81C081C0, 0xA8;
mul.rn.bf16x2 $0, p, $5;
and.b32 x, $4, 0x0F000F00;
shr.b32 a, x, 2;
mul.lo.u32 b, x, $10;
lop3.b32 p, a, b, 0x81C081C0, 0xA8;
mul.rn.bf16x2 $1, p, $5;
and.b32 x, $4, 0x00F000F0;
mul.lo.u32 a, x, $8;
mul.lo.u32 b, x, $9;
lop3.b32 p, a, b, 0x81C081C0, 0xA8;
mul.rn.bf16x2 $2, p, $5;
and.b32 x, $4, 0xF000F000;
shr.b32 a, x, 6;
lop3.b32 p, a, x, 0x81C081C0, 0xA8;
mul.rn.bf16x2 $3, p, $5;
}
"""
)
MMA_BIAS = 256.0  # products carry 2^-126 (decode) * 2^118 (scale) = 2^-8

_MMA_ASM = tl.constexpr(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)

# x bf16 pairs (x0 x1), (x2 x3), (x4 x5), (x6 x7) -> (x0 x4), (x2 x6), (x1 x5), (x3 x7)
_X_PAIRS_ASM = tl.constexpr(
    """
prmt.b32 $0, $4, $6, 0x5410;
prmt.b32 $1, $5, $7, 0x5410;
prmt.b32 $2, $4, $6, 0x7632;
prmt.b32 $3, $5, $7, 0x7632;
"""
)

# this lane's D[g][g] and D[g + 8][g] (g = lane / 4; lane 4g + g/2 holds them), else 0
_DIAG_ASM = tl.constexpr(
    """
{
.reg .u32 l, g, t;
.reg .pred p, q;
mov.u32 l, %laneid;
shr.u32 g, l, 2;
and.b32 t, l, 3;
shr.u32 l, g, 1;
setp.eq.u32 p, t, l;
and.b32 g, g, 1;
setp.eq.u32 q, g, 1;
selp.f32 $0, $3, $2, q;
selp.f32 $1, $5, $4, q;
selp.f32 $0, $0, 0f00000000, p;
selp.f32 $1, $1, 0f00000000, p;
}
"""
)


@triton.jit
def _scale_pair_bf16x2(pair):
    """A thread's two e4m3 block scales as one uint16 (first block low) -> bf16x2 bit patterns
    (s0, s0) and (s1, s1), s = e4m3 * 2^118 (exact): one e4m3x2 conversion for both."""
    return tl.inline_asm_elementwise(
        """
{
.reg .b16 h, l, u;
.reg .b32 f;
.reg .f32 a, b;
cvt.u16.u32 h, $2;
cvt.rn.f16x2.e4m3x2 f, h;
mov.b32 {l, u}, f;
cvt.f32.f16 a, l;
cvt.f32.f16 b, u;
mul.f32 a, a, 0f7A800000;
mul.f32 b, b, 0f7A800000;
cvt.rn.bf16x2.f32 $0, a, a;
cvt.rn.bf16x2.f32 $1, b, b;
}
""",
        "=r,=r,r",
        [pair.to(tl.int32)],
        dtype=(tl.int32, tl.int32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def _scale_bf16x2(raw):
    """e4m3 bytes -> bf16x2 bit patterns (s, s), s = e4m3 * 2^118 (exact)."""
    sc = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 3.3230699894622904e35  # 2^118
    return tl.inline_asm_elementwise(
        "cvt.rn.bf16x2.f32 $0, $1, $1;", "=r,r", [sc], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _decode_bf16(w, s2, one):
    return tl.inline_asm_elementwise(
        _E2M1X8_BF16_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r",
        [w, s2, one << 6, one << 12, one << 2, one << 8, one << 4],
        dtype=(tl.int32,) * 4, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def mma_lanes(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, ASM: tl.constexpr):
    """D + A * B of one mma.sync m16n8k16 given as ``ASM`` (bf16 here, f16 in kernels/fp8_mma.py)
    on each lane's fragments: a0..a3 of A, b0 b1 of B, d0..d3 the fp32 accumulators."""
    return tl.inline_asm_elementwise(
        ASM, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, d0, d1, d2, d3],
        dtype=(tl.float32,) * 4, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _x_pairs(x_row, kv, xq, K, EVEN: tl.constexpr):
    """The x values of each thread's word starting at value kv + 2 * xq[:, 0], as the bf16x2
    pairs (x0 x4), (x2 x6), (x1 x5), (x3 x7), each [1, R] int32."""
    kp = kv // 2 + xq
    if EVEN:
        xp = tl.load(x_row + kp)
    else:
        xp = tl.load(x_row + kp, mask=kp < K // 2, other=0)
    pa, pb = tl.split(tl.permute(tl.reshape(xp, [xq.shape[0], 2, 2]), (0, 2, 1)))
    p0, p1 = tl.split(pa)
    p2, p3 = tl.split(pb)
    q0, q1, q2, q3 = tl.inline_asm_elementwise(
        _X_PAIRS_ASM, "=r,=r,=r,=r,r,r,r,r", [p0, p1, p2, p3],
        dtype=(tl.int32,) * 4, is_pure=True, pack=1,
    )  # fmt: skip
    return q0[None, :], q1[None, :], q2[None, :], q3[None, :]


@triton.jit
def _mma_word(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, b2, b3, x_row, kv, xq, K,
              EVEN: tl.constexpr):  # fmt: skip
    """D + one word of rows a (pairs a0..a3) and b (b0..b3) times the matching x values."""
    x04, x26, x15, x37 = _x_pairs(x_row, kv, xq, K, EVEN)
    d0, d1, d2, d3 = mma_lanes(d0, d1, d2, d3, a0, b0, a1, b1, x04, x26, _MMA_ASM)
    d0, d1, d2, d3 = mma_lanes(d0, d1, d2, d3, a2, b2, a3, b3, x15, x37, _MMA_ASM)
    return d0, d1, d2, d3


@triton.jit
def _word_of(w, q: tl.constexpr, H: tl.constexpr, R: tl.constexpr):
    """Word q (0..3) of each thread: w [H, R, 4] -> [H, R]."""
    lo, hi = tl.split(tl.permute(tl.reshape(w, [H, R, 2, 2]), (0, 1, 3, 2)))  # words 0,1 / 2,3
    if q < 2:
        a, b = tl.split(lo)
    else:
        a, b = tl.split(hi)
    if q % 2 == 0:
        out = a
    else:
        out = b
    return out


@triton.jit
def _mma_chunk(
    d00, d01, d02, d03, d10, d11, d12, d13, d20, d21, d22, d23, d30, d31, d32, d33,
    w, s, one, x0, x1, x2, x3, k0, xq, K,
    BM: tl.constexpr, BN: tl.constexpr, R: tl.constexpr, EVEN: tl.constexpr,
    S16: tl.constexpr,
):  # fmt: skip
    """MMA variant of _chunk; dm0..dm3: x row m's D tensors [BN/2, R] (rows a: the program's
    first BN/2 rows, b: the others). S16: s holds a thread's two scale bytes per row as one
    uint16 [BN, R]."""
    H: tl.constexpr = BN // 2
    wa, wb = tl.split(tl.permute(tl.reshape(w, [2, H, R, 4]), (1, 2, 3, 0)))  # rows a / b
    if S16:  # both of a thread's scales of a row from one e4m3x2 conversion
        sa, sb = tl.split(tl.permute(tl.reshape(s, [2, H, R]), (1, 2, 0)))
        ca0, ca1 = _scale_pair_bf16x2(sa)
        cb0, cb1 = _scale_pair_bf16x2(sb)
    else:
        sa, sb = tl.split(tl.permute(tl.reshape(s, [2, H, R, 2]), (1, 2, 3, 0)))
        sa0, sa1 = tl.split(sa)
        sb0, sb1 = tl.split(sb)
        ca0, ca1 = _scale_bf16x2(sa0), _scale_bf16x2(sa1)
        cb0, cb1 = _scale_bf16x2(sb0), _scale_bf16x2(sb1)
    for word in tl.static_range(4):
        sca, scb = (ca0, cb0) if word < 2 else (ca1, cb1)  # words 0-1: block 0
        a0, a1, a2, a3 = _decode_bf16(_word_of(wa, word, H, R), sca, one)
        b0, b1, b2, b3 = _decode_bf16(_word_of(wb, word, H, R), scb, one)
        kv = k0 + 8 * word
        d00, d01, d02, d03 = _mma_word(d00, d01, d02, d03, a0, a1, a2, a3, b0, b1, b2, b3,
                                       x0, kv, xq, K, EVEN)  # fmt: skip
        if BM > 1:
            d10, d11, d12, d13 = _mma_word(d10, d11, d12, d13, a0, a1, a2, a3, b0, b1, b2, b3,
                                           x1, kv, xq, K, EVEN)  # fmt: skip
        if BM > 2:
            d20, d21, d22, d23 = _mma_word(d20, d21, d22, d23, a0, a1, a2, a3, b0, b1, b2, b3,
                                           x2, kv, xq, K, EVEN)  # fmt: skip
            d30, d31, d32, d33 = _mma_word(d30, d31, d32, d33, a0, a1, a2, a3, b0, b1, b2, b3,
                                           x3, kv, xq, K, EVEN)  # fmt: skip
    return d00, d01, d02, d03, d10, d11, d12, d13, d20, d21, d22, d23, d30, d31, d32, d33


@triton.jit
def _mma_rows(d0, d1, d2, d3, BN: tl.constexpr):
    """[BN, 1] sums of the program's rows (a then b) from one x row's D tensors."""
    ra, rb = tl.inline_asm_elementwise(
        _DIAG_ASM, "=f,=f,f,f,f,f", [d0, d1, d2, d3], dtype=(tl.float32,) * 2, is_pure=True,
        pack=1,
    )  # fmt: skip
    ya = tl.sum(ra, axis=1)  # [BN/2]
    yb = tl.sum(rb, axis=1)
    return tl.reshape(tl.permute(tl.join(ya, yb), (1, 0)), [BN])


@triton.jit
def _load_chunk(w_rows, s_rows, kw, wo, so, nmask, KW, KB, EVEN: tl.constexpr,
                S16: tl.constexpr):  # fmt: skip
    """Raw words [BN, R, 4] (uint32; loaded as [BN, 4R] from word offsets wo [1, 4R]) and
    scale bytes [BN, R, 2] (S16: [BN, R] uint16, a thread's two bytes as one word) of the chunk
    whose first word is kw (first block kw / 2). Past the last word: zero (EVEN: not loaded,
    undefined, unused)."""
    kb = kw // 4 if S16 else kw // 2
    nb = KB // 2 if S16 else KB
    if EVEN:  # whole chunks: one predicate for the chunk
        w = tl.load(w_rows + kw + wo, mask=wo * 0 + kw < KW, eviction_policy=WEIGHT_EVICT)
        s = tl.load(s_rows + kb + so, mask=so * 0 + kw < KW, eviction_policy=WEIGHT_EVICT)
    else:
        w = tl.load(
            w_rows + kw + wo,
            mask=nmask[:, None] & (kw + wo < KW),
            other=0,
            eviction_policy=WEIGHT_EVICT,
        )
        if S16:
            s = tl.load(
                s_rows + kb + so,
                mask=nmask[:, None] & (kb + so < nb),
                other=0,
                eviction_policy=WEIGHT_EVICT,
            )
        else:
            s = tl.load(
                s_rows + kb + so,
                mask=nmask[:, None, None] & (kb + so < nb),
                other=0,
                eviction_policy=WEIGHT_EVICT,
            )
    BN: tl.constexpr = w.shape[0]
    R: tl.constexpr = w.shape[1] // 4
    return tl.reshape(w, [BN, R, 4]).to(tl.uint32, bitcast=True), s


@triton.jit
def _chunk(acc0, acc1, acc2, acc3, w, s, one, x0, x1, x2, x3, k0, xo, xq, K,
           BM: tl.constexpr, BN: tl.constexpr, R: tl.constexpr, X32: tl.constexpr,
           EVEN: tl.constexpr, HW: tl.constexpr):  # fmt: skip
    """Add one K chunk (words w [BN, R, 4], scales s [BN, R, 2], first value k0)."""
    # words (0, 1) / (2, 3) of each thread: its two blocks
    wa, wb = tl.split(tl.permute(tl.reshape(w, [BN, R, 2, 2]), (0, 1, 3, 2)))
    w0, w1 = tl.split(wa)
    w2, w3 = tl.split(wb)
    sa, sb = tl.split(s)
    sca = fp8_raw_to_f32(sa, HW)  # [BN, R]
    scb = fp8_raw_to_f32(sb, HW)
    acc0, acc1, acc2, acc3 = _block(acc0, acc1, acc2, acc3, w0, w1, sca, one, x0, x1, x2, x3,
                                    k0, xo, xq, K, BM, X32, EVEN, HW)  # fmt: skip
    acc0, acc1, acc2, acc3 = _block(acc0, acc1, acc2, acc3, w2, w3, scb, one, x0, x1, x2, x3,
                                    k0 + 16, xo, xq, K, BM, X32, EVEN, HW)  # fmt: skip
    return acc0, acc1, acc2, acc3


@triton.jit
def _store_sum(y_row, y, rs, n, nmask, m, M):
    """y_row[n] = y [BN] (the rows' sums) * rs, for x row m < M."""
    tl.store(y_row + n, (y * rs).to(y_row.dtype.element_ty), mask=nmask & (n * 0 + m < M))

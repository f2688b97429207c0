"""The per-chunk pieces of kernels/fp8_mma.py's tensor-core GEMV: x loaded as f16 pairs, a
block's weight rows loaded, the lane-local MMAs of one row pair (fp8 bytes, or nvfp4 words in
kernels/nvfp4_mma.py's layout), and the fp32 row sums its fallback path computes. See
kernels/fp8_mma.py for the layout and the reasoning."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.launch import WEIGHT_EVICT
from kernels.nvfp4_mma import decode_scaled, scale_pairs, word_values
from kernels.nvfp4_words import mma_lanes

# a word's four e4m3 bytes (b0 b1 b2 b3, b0 lowest) -> f16 pairs (b0 b1), (b2 b3)
_E4M3X4_ASM = tl.constexpr(
    """
{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}
"""
)

_MMA_F16_ASM = tl.constexpr(
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)


@triton.jit
def _e4m3x4(w):
    return tl.inline_asm_elementwise(
        _E4M3X4_ASM, "=r,=r,r", [w], dtype=(tl.int32, tl.int32), is_pure=True, pack=1
    )


@triton.jit
def _f16x2(lo, hi):
    """fp32 values -> f16 pair bits (lo in the low half), round to nearest."""
    return tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _bf16_pair(p):
    """bf16 pair bits (int32) -> (low, high) fp32 values."""
    lo = (p << 16).to(tl.float32, bitcast=True)
    hi = (p & -65536).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _x_pairs(x_row, kp, K, EVEN: tl.constexpr):
    """The bf16 pairs of x at kp [R, 4] as uint32 (zero past K unless EVEN)."""
    if EVEN:
        p = tl.load(x_row + kp)
    else:
        p = tl.load(x_row + kp, mask=kp < K // 2, other=0)
    return p.to(tl.uint32, bitcast=True)


@triton.jit
def _x_load(x_row, kp, K, GLU: tl.constexpr, EVEN: tl.constexpr):
    """f(x) at the bf16 pairs kp [R, 4] (one 16-byte load per thread, two with GLU) as the
    (low, high) fp32 values of each pair."""
    lo, hi = _bf16_pair(_x_pairs(x_row, kp, K, EVEN).to(tl.int32, bitcast=True))
    if GLU:
        ulo, uhi = _bf16_pair(_x_pairs(x_row + K // 2, kp, K, EVEN).to(tl.int32, bitcast=True))
        lo = lo * tl.sigmoid(lo) * ulo
        hi = hi * tl.sigmoid(hi) * uhi
    return lo, hi


@triton.jit
def _x_f16(x_row, kp, K, GLU: tl.constexpr, EVEN: tl.constexpr, NORM: tl.constexpr):
    """Thread t's 16 x values (pairs kp [R, 4] and kp + 4) as two [R, 4] tensors of f16 pairs
    (a value f16 cannot hold becomes inf: see _store_pair). With NORM, x already is f16 pairs
    (the producer's s * gain) and is loaded as it is."""
    if NORM:
        xa = _x_pairs(x_row, kp, K, EVEN).to(tl.int32, bitcast=True)
        xb = _x_pairs(x_row, kp + 4, K, EVEN).to(tl.int32, bitcast=True)
    else:
        lo, hi = _x_load(x_row, kp, K, GLU, EVEN)
        lo2, hi2 = _x_load(x_row, kp + 4, K, GLU, EVEN)
        xa, xb = _f16x2(lo, hi), _f16x2(lo2, hi2)
    return xa, xb


@triton.jit
def _gain(g_ptr, i, ZC: tl.constexpr):
    """RMSNorm gain(s) at i in fp32 (zero-centred: 1 + w)."""
    g = tl.load(g_ptr + i).to(tl.float32)
    if ZC:
        g = g + 1.0
    return g


@triton.jit
def _pick(v, j: tl.constexpr):
    """Element j of a small vector, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, v.shape[0]) == j, v, 0.0), axis=0)


@triton.jit
def _quarter(c, j: tl.constexpr, R: tl.constexpr):
    """Element j (0..3) of each thread's four: [R, 4] -> [R] (a register pick)."""
    e, o = tl.split(tl.reshape(c, [R, 2, 2]))  # elements (0, 2) / (1, 3)
    if j % 2 == 0:
        f = e
    else:
        f = o
    f0, f1 = tl.split(f)
    if j < 2:
        out = f0
    else:
        out = f1
    return out


@triton.jit
def _x_pair(xa, xb, j: tl.constexpr, R: tl.constexpr):
    """Pair j (0..7) of each thread's 8 (pairs 0..3 in xa, 4..7 in xb, [R, 4]) -> [R]."""
    if j < 4:
        out = _quarter(xa, j, R)
    else:
        out = _quarter(xb, j - 4, R)
    return out


@triton.jit
def _pair_mma(d0, d1, d2, d3, wa, wb, xa, xb, R: tl.constexpr):
    """D + the products of one chunk of a row pair: words wa / wb [R, 4] of rows a / b and
    thread t's 16 x values (8 f16 pairs in xa, xb; word q holds values 4q..4q+3 = pairs 2q and
    2q + 1)."""
    for q in tl.static_range(4):
        a0, a2 = _e4m3x4(_quarter(wa, q, R))
        a1, a3 = _e4m3x4(_quarter(wb, q, R))
        d0, d1, d2, d3 = mma_lanes(d0, d1, d2, d3, a0, a1, a2, a3, _x_pair(xa, xb, 2 * q, R),
                                   _x_pair(xa, xb, 2 * q + 1, R), _MMA_F16_ASM)  # fmt: skip
    return d0, d1, d2, d3


@triton.jit
def _pair_mma4(d0, d1, d2, d3, wa, wb, sa, sb, xa, xb, xc, xd, R: tl.constexpr):
    """_pair_mma for nvfp4 words (kernels/nvfp4_mma.py's layout; word q holds values
    8q..8q+7 = pairs 4q..4q+3 of thread t's 32 x values, in xa / xb / xc / xd for q = 0..3);
    sa / sb [R]: the thread's two block scales of rows a / b as one uint16."""
    ca0, ca1 = scale_pairs(sa)
    cb0, cb1 = scale_pairs(sb)
    for q in tl.static_range(4):
        sca, scb = (ca0, cb0) if q < 2 else (ca1, cb1)  # words 0-1: block 0
        if q == 0:
            xq = xa
        elif q == 1:
            xq = xb
        elif q == 2:
            xq = xc
        else:
            xq = xd
        a0, a1, a2, a3 = decode_scaled(_quarter(wa, q, R), sca)
        b0, b1, b2, b3 = decode_scaled(_quarter(wb, q, R), scb)
        d0, d1, d2, d3 = mma_lanes(d0, d1, d2, d3, a0, b0, a1, b1, _quarter(xq, 0, R),
                                   _quarter(xq, 1, R), _MMA_F16_ASM)  # fmt: skip
        d0, d1, d2, d3 = mma_lanes(d0, d1, d2, d3, a2, b2, a3, b3, _quarter(xq, 2, R),
                                   _quarter(xq, 3, R), _MMA_F16_ASM)  # fmt: skip
    return d0, d1, d2, d3


@triton.jit
def _row_load(ptr, row, k, o, N, KL, EVEN: tl.constexpr):
    """A row's share of a chunk at ptr (per thread offsets o from the chunk's start k: the
    weight words [R, 4], or the block scale pairs [R]); zero past the matrix (row >= N or k + o
    >= KL) unless EVEN."""
    if EVEN:
        w = tl.load(ptr, eviction_policy=WEIGHT_EVICT)
    else:
        w = tl.load(
            ptr, mask=(o * 0 + row < N) & (k + o < KL), other=0, eviction_policy=WEIGHT_EVICT
        )
    return w


@triton.jit
def _chunk_rows(pa, pb, a0, PA: tl.constexpr, ob, stride, k, o, N, KL,
                EVEN: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """The chunk at k of a block's BN / 2 row pairs (a, b) = (a0 + PA * p, a + ob), as
    w0 = a of pair 0, w1 = its b, w2 = a of pair 1, ... (BN = 2, 4 or 8; the unused of the eight
    results repeat w0). pa / pb: the chunk's pointers in rows a0 and a0 + ob, rows ``stride``
    apart (the weight words, or an nvfp4 weight's block scale pairs; see _row_load)."""
    w0 = _row_load(pa, a0, k, o, N, KL, EVEN)
    w1 = _row_load(pb, a0 + ob, k, o, N, KL, EVEN)
    w2, w3, w4, w5, w6, w7 = w0, w0, w0, w0, w0, w0
    if BN > 2:
        w2 = _row_load(pa + PA * stride, a0 + PA, k, o, N, KL, EVEN)
        w3 = _row_load(pb + PA * stride, a0 + PA + ob, k, o, N, KL, EVEN)
    if BN > 4:
        w4 = _row_load(pa + 2 * PA * stride, a0 + 2 * PA, k, o, N, KL, EVEN)
        w5 = _row_load(pb + 2 * PA * stride, a0 + 2 * PA + ob, k, o, N, KL, EVEN)
        w6 = _row_load(pa + 3 * PA * stride, a0 + 3 * PA, k, o, N, KL, EVEN)
        w7 = _row_load(pb + 3 * PA * stride, a0 + 3 * PA + ob, k, o, N, KL, EVEN)
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def _fma_row(x_row, w_ptr, row, N, K, stride_wn, GLU: tl.constexpr, BK: tl.constexpr, g_ptr,
             NORM: tl.constexpr, ZC: tl.constexpr):  # fmt: skip
    """fp32 sum of weight row ``row`` against one x row, from the bytes with fp32 FMAs (the
    path for x values f16 cannot hold). With NORM, x_row is the hidden state s and the values
    are s * gain, as the producer's f16 copy holds them."""
    w_row = w_ptr.to(tl.pointer_type(tl.uint8)) + row.to(tl.int64) * (4 * stride_wn)
    kk = tl.arange(0, BK)
    acc = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + kk
        ok = (k < K) & (k * 0 + row < N)
        w = tl.load(w_row + k, mask=ok, other=0)
        x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
        if GLU:
            x = x * tl.sigmoid(x) * tl.load(x_row + K + k, mask=k < K, other=0.0).to(tl.float32)
        if NORM:
            x = x * _gain(g_ptr, tl.minimum(k, K - 1), ZC)
        acc += w.to(tl.float8e4nv, bitcast=True).to(tl.float32) * x
    return tl.sum(acc, axis=0)


@triton.jit
def _x_value(x_row, k, K, GLU: tl.constexpr, NORM: tl.constexpr, g_ptr, ZC: tl.constexpr):
    """f(x) at values k (zero past K) in fp32, as _fma_row reads it."""
    x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
    if GLU:
        x = x * tl.sigmoid(x) * tl.load(x_row + K + k, mask=k < K, other=0.0).to(tl.float32)
    if NORM:
        x = x * _gain(g_ptr, tl.minimum(k, K - 1), ZC)
    return x


@triton.jit
def _fma_row4(x_row, w_ptr, bs_ptr, row, N, K, stride_wn, GLU: tl.constexpr, BW: tl.constexpr,
              g_ptr, NORM: tl.constexpr, ZC: tl.constexpr):  # fmt: skip
    """_fma_row for repacked nvfp4 words (times 2^-14, as the MMA sums)."""
    w_row = w_ptr + row.to(tl.int64) * stride_wn
    s_row = bs_ptr + row.to(tl.int64) * (K // 16)
    kk = tl.arange(0, BW)
    acc = tl.zeros([BW], dtype=tl.float32)
    for k0 in range(0, K // 8, BW):
        kw = k0 + kk
        ok = (kw < K // 8) & (kw * 0 + row < N)
        w = tl.load(w_row + kw, mask=ok, other=0)
        sc = tl.load(s_row + kw // 2, mask=ok, other=0).to(tl.float8e4nv, bitcast=True)
        v0, v1, v2, v3, v4, v5, v6, v7 = word_values(w)
        k = kw * 8
        part = v0 * _x_value(x_row, k, K, GLU, NORM, g_ptr, ZC)
        part += v1 * _x_value(x_row, k + 1, K, GLU, NORM, g_ptr, ZC)
        part += v2 * _x_value(x_row, k + 2, K, GLU, NORM, g_ptr, ZC)
        part += v3 * _x_value(x_row, k + 3, K, GLU, NORM, g_ptr, ZC)
        part += v4 * _x_value(x_row, k + 4, K, GLU, NORM, g_ptr, ZC)
        part += v5 * _x_value(x_row, k + 5, K, GLU, NORM, g_ptr, ZC)
        part += v6 * _x_value(x_row, k + 6, K, GLU, NORM, g_ptr, ZC)
        part += v7 * _x_value(x_row, k + 7, K, GLU, NORM, g_ptr, ZC)
        acc += part * sc.to(tl.float32)
    return tl.sum(acc, axis=0)

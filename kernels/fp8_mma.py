"""Batch-1 decode GEMV of an fp8 weight on tensor cores (CUDA, sm_89+): y = f(x) @ (s · e4m3(W))ᵀ.

Same contract as kernels/fp8_gemv.fp8_gemv (W [N, K] e4m3 bytes, one fp32 scale per row, f(x) = x
or silu(gate) * up with ``glu``), for one row of bf16 x. The fp32-FMA kernel spends ~3.4 SASS
instructions per weight byte (e4m3 -> f16 -> f32 conversions and one FMA per value) and issues
on every other cycle at 37 % occupancy (Nsight Compute on the H200): it is instruction-bound.
Here a weight byte costs ~1.5 (8 rows per block) to ~2.0 (4 rows; the x conversion is shared
by fewer rows) sm_90 SASS instructions in the K loop:

- a block of BN weight rows is taken as BN/2 row pairs (a, b); thread t holds 32-bit words
  [4t, 4t + 4) of each row in every K chunk (16 values; one 16-byte load per row), each row a
  separate [R, 4] load so that the lane / register layout is the same for every row (triton
  3.6 spread the rows of one [rows, R, 4] load across lanes);
- ``cvt.rn.f16x2.e4m3x2`` turns two weight bytes into an f16 pair (exact: every e4m3 value is an
  f16), and x is rounded to f16 pairs once per chunk (shared by all BN rows);
- ``mma.sync m16n8k16`` (f16 in, fp32 accumulate) runs on lane-local data: lane (g, t) feeds
  words of its rows a and b as A rows g and g + 8 and its own x values as B column g, so D[g][g]
  and D[g + 8][g] accumulate the products of quad g's four lanes (nvfp4_words' _DIAG_ASM picks
  them out at the end); one MMA covers 4 values of 2 rows per lane;
- the row scale multiplies each row's sum once, at the end; with ``swiglu_out`` (W = [gate;
  up]) a pair is a gate row and its up row, and the kernel writes silu(gate) * up;
- programs take one row block each, or (``per_sm``) a few per SM loop over the blocks.

Numerics: e4m3 -> f16 and the tensor-core products are exact and accumulate in fp32. x -> f16
is exact for 2^-14 <= |x| < 65504; smaller values keep their bits down to 2^-24 (f16
subnormals: an absolute error below 3e-8 per value). A value beyond f16's range (it rounds to
inf; NaN stays NaN) turns every row sum it enters into inf or NaN, so a row whose sum is not
finite is computed again with fp32 FMAs from the bytes (`_fma_row`): large activations stay
exact at the cost of one more pass over those rows, and the K loop tests nothing (an abs and a
compare per value cost 144 -> 107 instructions per chunk at 4 rows; the test on the bf16 bits,
two integer ops per pair, 107 -> 84 with it gone).

An RMSNorm between two of these projections can run inside them (kernels/folded_norm.py,
ninfer/passes/fuse_norm_linear.py): with a `ResidualNorm` the first one writes s = residual + y,
u = f16(s * gain) and its programs' sums of s² (relaxed atomics); the second one, given a
`NormedX`, reads u as its f16 x pairs (no conversion in the K loop) and scales its row sums by
1 / rms(s). Against the separate kernel the input is rounded once, to f16, where rmsnorm rounds
the normalised value to bf16; a u beyond f16 takes the fp32 path like x.

nvfp4 weights run here too, as an `Nvfp4MmaWeight` (kernels/nvfp4_mma.py: a repacked copy made
at load): a word holds 8 values, so a chunk is 32 values per thread and row; each word gives four
f16 pairs (e2m1 * 2^-14) that are multiplied by the block scale (one cvt.rn.f16x2.e4m3x2 gives a
thread's two) before two MMAs; the row scale (global * 2^14) multiplies the sums, and the fp32
path decodes the same words (`_fma_row4`). Launch shapes: kernels/nvfp4_mma_table.json.

The per-chunk pieces (x loads, row loads, the MMAs of a row pair, the fp32 row sums) live in
kernels/mma_chunks.py; this file has the kernel, its epilogue, the launch tables and the wrapper.

Launch shapes (`Fp8MmaConfig`) come from kernels/fp8_mma_table.json, written by
``bench/fp8_mma_bench.py --write-table``; `fp8_mma_config` returns None for shapes where the
sweep kept kernels/fp8_gemv.py, for batch sizes above 1, and under the interpreter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.folded_norm import NORM_STATS, NormedX, ResidualNorm, check_norm_parts
from kernels.gemv import load_table, table_config
from kernels.launch import interpreting, pdl_args, pdl_wait
from kernels.mma_chunks import (
    _chunk_rows,
    _fma_row,
    _fma_row4,
    _gain,
    _pair_mma,
    _pair_mma4,
    _pick,
    _x_f16,
)
from kernels.nvfp4_mma import Nvfp4MmaWeight
from kernels.nvfp4_words import _DIAG_ASM
from kernels.quant_decode import fp8_bytes

STATS = tl.constexpr(NORM_STATS)


@triton.jit
def _store_pair(y_ptr, s_ptr, ra, ob, N, K, d0, d1, d2, d3, x_ptr, w_ptr, stride_wn,
                GLU: tl.constexpr, SWIGLU: tl.constexpr, R: tl.constexpr, rstd, xs_ptr, gin_ptr,
                NORM: tl.constexpr, ZC_IN: tl.constexpr, rv, gv, p: tl.constexpr, u_ptr,
                RES: tl.constexpr, bs_ptr, FP4: tl.constexpr):  # fmt: skip
    """The sums of rows ra and rb = ra + ob times their scales (from the MMA sums, or recomputed
    in fp32 when one is not finite) to y[ra] and y[rb]; with SWIGLU (rows
    ra of the gate half and rb of the up half) silu(gate) * up to y[ra], gate and up rounded to
    y's dtype first, as a separate activation would see them. NORM: the sums times ``rstd``
    first (the input was s * gain). RES (pair p of the block: rows 2p, 2p + 1 of the block's
    residual values rv and next-norm gains gv): y = s = residual + y (each rounded to y's dtype,
    as the separate residual add), u = f16(s * gain); returns the sum of s² over the two rows
    (0 without RES)."""
    rb = ra + ob
    da, db = tl.inline_asm_elementwise(
        _DIAG_ASM, "=f,=f,f,f,f,f", [d0, d1, d2, d3], dtype=(tl.float32,) * 2, is_pure=True,
        pack=1,
    )  # fmt: skip
    ya = tl.sum(da, axis=0)
    yb = tl.sum(db, axis=0)
    # an x value f16 cannot hold (|x| >= 65504, inf, NaN) became inf or NaN, and so did every
    # sum it entered (times a weight: inf, or NaN for a zero weight); finite e4m3 x f16 products
    # cannot overflow an fp32 sum. Such a row is computed again in fp32 from the bytes.
    if not ((tl.abs(ya) < float("inf")) & (tl.abs(yb) < float("inf"))):
        if NORM:
            xr = xs_ptr
        else:
            xr = x_ptr.to(tl.pointer_type(tl.bfloat16))
        if FP4:
            ya = _fma_row4(xr, w_ptr, bs_ptr, ra, N, K, stride_wn, GLU, R, gin_ptr, NORM, ZC_IN)
            yb = _fma_row4(xr, w_ptr, bs_ptr, rb, N, K, stride_wn, GLU, R, gin_ptr, NORM, ZC_IN)
        else:
            ya = _fma_row(xr, w_ptr, ra, N, K, stride_wn, GLU, 4 * R, gin_ptr, NORM, ZC_IN)
            yb = _fma_row(xr, w_ptr, rb, N, K, stride_wn, GLU, 4 * R, gin_ptr, NORM, ZC_IN)
    if NORM:
        ya = ya * rstd
        yb = yb * rstd
    ya = ya * tl.load(s_ptr + ra, mask=ra < N, other=0.0)
    yb = yb * tl.load(s_ptr + rb, mask=rb < N, other=0.0)
    out = y_ptr.dtype.element_ty
    sq = tl.full([], 0.0, tl.float32)
    if SWIGLU:
        g = ya.to(out).to(tl.float32)
        act = g * tl.sigmoid(g) * yb.to(out).to(tl.float32)
        tl.store(y_ptr + ra, act.to(out), mask=rb < N)
    elif RES:
        sa = (ya.to(out).to(tl.float32) + _pick(rv, 2 * p)).to(out)
        sb = (yb.to(out).to(tl.float32) + _pick(rv, 2 * p + 1)).to(out)
        tl.store(y_ptr + ra, sa, mask=ra < N)
        tl.store(y_ptr + rb, sb, mask=rb < N)
        fa = sa.to(tl.float32)
        fb = sb.to(tl.float32)
        ga = _pick(gv, 2 * p)
        gb = _pick(gv, 2 * p + 1)
        tl.store(u_ptr + ra, (fa * ga).to(tl.float16), mask=ra < N)
        tl.store(u_ptr + rb, (fb * gb).to(tl.float16), mask=rb < N)
        sq = tl.where(ra < N, fa * fa, 0.0) + tl.where(rb < N, fb * fb, 0.0)
    else:
        tl.store(y_ptr + ra, ya.to(out), mask=ra < N)
        tl.store(y_ptr + rb, yb.to(out), mask=rb < N)
    return sq


@triton.jit
def _fp8_mma_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, N, K, ROW_WORDS: tl.constexpr,
    GLU: tl.constexpr, SWIGLU: tl.constexpr, BN: tl.constexpr, R: tl.constexpr,
    EVEN: tl.constexpr, PDL: tl.constexpr,
    xs_ptr, gin_ptr, st_in_ptr, eps, NORM: tl.constexpr, ZC_IN: tl.constexpr,
    r_ptr, g_ptr, u_ptr, st_ptr, RES: tl.constexpr, ZC: tl.constexpr,
    bs_ptr, FP4: tl.constexpr,
):  # fmt: skip
    # grid (G,), one x row: program p computes row blocks p, p + G, ... of BN rows (G = the
    # row blocks, or a few programs per SM: then every program is resident from the start and
    # the next kernel's programs, launched early, find room to issue their first loads).
    # w_ptr: the weight as int32 words [N, K/4], rows ROW_WORDS words apart (a constant: a
    # block's rows load from one pointer, advanced per chunk, at immediate offsets; 125 -> 107
    # SASS per chunk at 4 rows); x_ptr: the bf16 x row as int32 pairs. A chunk is R threads x 4
    # words per row; a block's rows are taken as pairs (2p, 2p + 1), p < BN / 2 <= 4, each row
    # a separate [R, 4] load so that thread t (lane t % 32 of warp t // 32) holds the same K
    # words of every row: the lane-local MMA needs a lane's weights and x to share their K
    # positions.
    # FP4: the weight is nvfp4 in kernels/nvfp4_mma.py's words (8 values each), bs_ptr its
    # block scales (thread t's two of a row per chunk as one uint16); s_ptr the row scales
    i = tl.arange(0, R)
    wo = (i * 4)[:, None] + tl.arange(0, 4)[None, :]  # [R, 4]
    VW: tl.constexpr = 8 if FP4 else 4  # values per word
    kp0 = (i * 2 * VW)[:, None] + tl.arange(0, 4)[None, :]  # [R, 4] x pairs 0..3 of thread t
    KW = K // VW
    KQ = K // 32  # FP4: scale pairs per row
    bs16 = bs_ptr.to(tl.pointer_type(tl.uint16))
    # a block's row pairs: (n0 + 2p, n0 + 2p + 1), or with SWIGLU (j0 + p, j0 + p + N / 2): a
    # gate row and its up row, whose activation is output j0 + p
    PA: tl.constexpr = 1 if SWIGLU else 2
    ob = N // 2 if SWIGLU else 1
    # NORM (the input is an RMSNorm's, folded in, see `NormedX`): x_ptr holds f16(s * gain) and
    # the sums are scaled by 1 / rms(s) from the producer's partial sums of s² (st_in_ptr).
    # RES (`ResidualNorm`): y = s = residual + this projection, plus u = f16(s * the next
    # RMSNorm's gain) and this program's sum of s² added to st_ptr[program % STATS].
    sq = tl.full([], 0.0, tl.float32)
    for blk in range(tl.program_id(0), tl.cdiv(N, BN), tl.num_programs(0)):
        n0 = blk * (BN // 2) * PA  # BN rows, or BN / 2 gate rows (and their up rows)
        d00 = tl.zeros([R], dtype=tl.float32)
        d01, d02, d03, d10, d11, d12, d13 = d00, d00, d00, d00, d00, d00, d00
        d20, d21, d22, d23, d30, d31, d32, d33 = d00, d00, d00, d00, d00, d00, d00, d00
        pa = w_ptr + n0.to(tl.int64) * ROW_WORDS + wo  # rows n0 and n0 + ob, advanced per chunk
        pb = pa + ob * ROW_WORDS
        qa = bs16 + n0.to(tl.int64) * KQ + i  # FP4: the same rows' scale pairs
        qb = qa + ob * KQ
        st = tl.zeros([STATS], dtype=tl.float32)
        rows = n0 + tl.arange(0, BN)  # RES: the block's rows (no SWIGLU: n0 .. n0 + BN - 1)
        rv = tl.zeros([BN], dtype=tl.float32)
        gv = rv
        if RES:
            gv = _gain(g_ptr, tl.minimum(rows, N - 1), ZC)  # a weight: before the wait
        for kw in range(0, KW, 4 * R):
            w0, w1, w2, w3, w4, w5, w6, w7 = _chunk_rows(pa, pb, n0, PA, ob, ROW_WORDS, kw, wo,
                                                         N, KW, EVEN, BN)  # fmt: skip
            pa += 4 * R
            pb += 4 * R
            if FP4:
                s0, s1, s2, s3, s4, s5, s6, s7 = _chunk_rows(qa, qb, n0, PA, ob, KQ, kw // 4, i,
                                                             N, KQ, EVEN, BN)  # fmt: skip
                qa += R
                qb += R
            pdl_wait(PDL)  # the first chunk's weight loads overlap the previous kernel's tail
            if kw == 0:  # what the block's end needs, loaded now so that its latency is hidden
                if NORM:
                    st = tl.load(st_in_ptr + tl.arange(0, STATS))
                if RES:
                    rv = tl.load(r_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
            xa, xb = _x_f16(x_ptr, VW // 2 * kw + kp0, K, GLU, EVEN, NORM)
            if FP4:
                xc, xd = _x_f16(x_ptr, VW // 2 * kw + kp0 + 8, K, GLU, EVEN, NORM)
                d00, d01, d02, d03 = _pair_mma4(d00, d01, d02, d03, w0, w1, s0, s1, xa, xb, xc,
                                                xd, R)  # fmt: skip
                if BN > 2:
                    d10, d11, d12, d13 = _pair_mma4(d10, d11, d12, d13, w2, w3, s2, s3, xa, xb,
                                                    xc, xd, R)  # fmt: skip
                if BN > 4:
                    d20, d21, d22, d23 = _pair_mma4(d20, d21, d22, d23, w4, w5, s4, s5, xa, xb,
                                                    xc, xd, R)  # fmt: skip
                    d30, d31, d32, d33 = _pair_mma4(d30, d31, d32, d33, w6, w7, s6, s7, xa, xb,
                                                    xc, xd, R)  # fmt: skip
            else:
                d00, d01, d02, d03 = _pair_mma(d00, d01, d02, d03, w0, w1, xa, xb, R)
                if BN > 2:
                    d10, d11, d12, d13 = _pair_mma(d10, d11, d12, d13, w2, w3, xa, xb, R)
                if BN > 4:
                    d20, d21, d22, d23 = _pair_mma(d20, d21, d22, d23, w4, w5, xa, xb, R)
                    d30, d31, d32, d33 = _pair_mma(d30, d31, d32, d33, w6, w7, xa, xb, R)
        rstd = 1.0
        if NORM:
            rstd = 1.0 / tl.sqrt(tl.sum(st, axis=0) / K + eps)
        sq += _store_pair(y_ptr, s_ptr, n0, ob, N, K, d00, d01, d02, d03, x_ptr, w_ptr,
                          ROW_WORDS, GLU, SWIGLU, R, rstd, xs_ptr, gin_ptr, NORM, ZC_IN, rv, gv,
                          0, u_ptr, RES, bs_ptr, FP4)  # fmt: skip
        if BN > 2:
            sq += _store_pair(y_ptr, s_ptr, n0 + PA, ob, N, K, d10, d11, d12, d13, x_ptr, w_ptr,
                              ROW_WORDS, GLU, SWIGLU, R, rstd, xs_ptr, gin_ptr, NORM, ZC_IN, rv,
                              gv, 1, u_ptr, RES, bs_ptr, FP4)  # fmt: skip
        if BN > 4:
            sq += _store_pair(y_ptr, s_ptr, n0 + 2 * PA, ob, N, K, d20, d21, d22, d23, x_ptr,
                              w_ptr, ROW_WORDS, GLU, SWIGLU, R, rstd, xs_ptr, gin_ptr, NORM,
                              ZC_IN, rv, gv, 2, u_ptr, RES, bs_ptr, FP4)  # fmt: skip
            sq += _store_pair(y_ptr, s_ptr, n0 + 3 * PA, ob, N, K, d30, d31, d32, d33, x_ptr,
                              w_ptr, ROW_WORDS, GLU, SWIGLU, R, rstd, xs_ptr, gin_ptr, NORM,
                              ZC_IN, rv, gv, 3, u_ptr, RES, bs_ptr, FP4)  # fmt: skip
    if RES:
        tl.atomic_add(st_ptr + tl.program_id(0) % STATS, sq, sem="relaxed")


@dataclass(frozen=True)
class Fp8MmaConfig:
    """BN weight rows per block (2, 4 or 8), num_warps (K chunk = 16 * 32 * warps), programs
    per SM (``per_sm``; 0: one program per row block), and a register cap per thread
    (``maxnreg``; 0: none), which decides how many programs fit on an SM at once."""

    bn: int
    warps: int
    per_sm: int = 0
    maxnreg: int = 0

    @property
    def bk(self) -> int:
        return 16 * 32 * self.warps


TABLE_PATH = Path(__file__).with_name("fp8_mma_table.json")


def _config_type(bn: int, warps: int, per_sm: int, maxnreg: int = 0) -> Fp8MmaConfig:
    return Fp8MmaConfig(bn, warps, per_sm, maxnreg)  # the table's fields, in order


TABLE = load_table(TABLE_PATH, _config_type)  # read once at import
# nvfp4 weights (kernels/nvfp4_mma.py's layout): their own table; unmeasured shapes take
# NVFP4_DEFAULT, and a measured shape with no entry keeps kernels/nvfp4_gemv.py
NVFP4_TABLE_PATH = Path(__file__).with_name("nvfp4_mma_table.json")
NVFP4_TABLE = load_table(NVFP4_TABLE_PATH, _config_type)
NVFP4_DEFAULT = Fp8MmaConfig(4, 2)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _has_e4m3_cvt(device: torch.device) -> bool:
    """cvt.rn.f16x2.e4m3x2 needs sm_89 or later."""
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_mma_config(N: int, K: int, M: int, glu: bool = False) -> Fp8MmaConfig | None:
    """The measured launch shape for one row of x (M = 1) against an [N, K] fp8 weight, or
    None (the FMA kernel of kernels/fp8_gemv.py: other batch sizes, unmeasured shapes, shapes
    where it won, and the interpreter, which has no tensor cores)."""
    if interpreting() or M != 1:
        return None
    return table_config(TABLE, N, K, M, glu, None)


def nvfp4_mma_config(N: int, K: int, M: int, glu: bool = False) -> Fp8MmaConfig | None:
    """fp8_mma_config for an nvfp4 weight (NVFP4_TABLE; NVFP4_DEFAULT where unmeasured)."""
    if interpreting() or M != 1:
        return None
    return table_config(NVFP4_TABLE, N, K, M, glu, NVFP4_DEFAULT)


def _usable_x(x: torch.Tensor) -> bool:
    """One row of 4-byte aligned bf16 x on a CUDA device of sm_89 or later."""
    return (
        x.is_cuda
        and _has_e4m3_cvt(x.device)
        and x.dtype == torch.bfloat16
        and x.shape[0] == 1
        and x.data_ptr() % 4 == 0
    )


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether fp8_mma can take x and w: one row of bf16 x on a CUDA device of sm_89 or later,
    4-byte aligned, and weight rows 4-byte aligned with K a multiple of 4."""
    aligned = w.shape[1] % 4 == 0 and w.data_ptr() % 4 == 0 and w.stride(0) % 4 == 0
    return _usable_x(x) and aligned


def usable_nvfp4(x: torch.Tensor, w: Nvfp4MmaWeight) -> bool:
    """`usable` for an nvfp4 weight in the tensor-core layout (its K a multiple of 32: a
    thread's block scales are read in pairs)."""
    return _usable_x(x) and w.shape[1] % 32 == 0


def fp8_mma(
    x: torch.Tensor | NormedX,
    w: torch.Tensor | Nvfp4MmaWeight,
    scale: torch.Tensor | None,
    config: Fp8MmaConfig,
    *,
    glu: bool = False,
    swiglu_out: bool = False,
    residual: ResidualNorm | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """y [1, N] in bf16 = f(x) @ (scale[:, None] * e4m3(w))ᵀ on tensor cores, for one row x
    [1, K or 2K]; the contract of kernels/fp8_gemv.fp8_gemv where `usable` holds. With
    ``swiglu_out`` (w = [gate; up], N even) the result is silu(y[:, :N/2]) * y[:, N/2:], [1, N/2],
    gate and up rounded to bf16 first. x a `NormedX`: the projection of rmsnorm(s) * gain.
    With ``residual`` (see `ResidualNorm`): returns (s, u). w an `Nvfp4MmaWeight`: an nvfp4
    weight (``scale`` unused: the weight carries its scales). No host synchronisation."""
    normed = x if isinstance(x, NormedX) else None
    xb = normed.s if normed is not None else x
    fp4 = isinstance(w, Nvfp4MmaWeight)
    if fp4:
        assert usable_nvfp4(xb, w), "fp8_mma needs one row of CUDA bf16 x and K % 32 == 0"
        N, K = w.shape
        scale, bscale, words = w.row_scale, w.block_scale, w.words
    else:
        assert w.dim() == 2 and w.stride(-1) == 1
        w = fp8_bytes(w)
        N, K = w.shape
        assert usable(xb, w), "fp8_mma needs one row of CUDA bf16 x and 4-byte aligned rows"
        words = w.view(torch.int32)
        bscale = words
    assert xb.dim() == 2 and xb.stride(-1) == 1
    assert config.bn in (2, 4, 8), config
    assert xb.shape[1] == (2 * K if glu else K), (xb.shape, (N, K), glu)
    ok = scale.shape == (N,) and scale.dtype == torch.float32 and scale.stride(0) == 1
    assert ok, f"scale must be contiguous fp32 [{N}], got {scale.dtype} {tuple(scale.shape)}"
    assert not swiglu_out or N % 2 == 0, "swiglu_out needs the [gate; up] rows of an even N"
    assert normed is None or not glu, "a normalised input has no activation"
    assert residual is None or not swiglu_out, "the residual epilogue writes the projection"
    y = torch.empty((1, N // 2 if swiglu_out else N), dtype=xb.dtype, device=xb.device)
    u = torch.empty((1, N), dtype=torch.float16, device=xb.device) if residual else None
    if N == 0:
        return y if residual is None else (y, u)
    cfg = config
    even = K % (cfg.bk * (2 if fp4 else 1)) == 0 and N % cfg.bn == 0
    blocks = triton.cdiv(N, cfg.bn)
    if cfg.per_sm:
        blocks = min(blocks, cfg.per_sm * _sm_count(xb.device))
    if normed is not None:
        check_norm_parts(normed.u, normed.gain, normed.stats, K, xb)
        nx = (normed.u.view(torch.int32), xb, normed.gain, normed.stats, normed.eps)
        nz = normed.zero_centered
    else:
        nx, nz = (xb.view(torch.int32), xb, scale, scale, 0.0), False
    if residual is not None:
        r = residual
        assert r.residual.shape == (1, N) and r.residual.dtype == xb.dtype, r.residual.shape
        check_norm_parts(u, r.gain, r.stats, N, xb)
        rx = (r.residual, r.gain, u, r.stats)
        rz = r.zero_centered
    else:
        rx, rz = (y, scale, y, scale), False
    _fp8_mma_kernel[(blocks,)](
        nx[0], words, scale, y, N, K, ROW_WORDS=words.stride(0),
        GLU=glu, SWIGLU=swiglu_out, BN=cfg.bn, R=32 * cfg.warps, EVEN=even,
        xs_ptr=nx[1], gin_ptr=nx[2], st_in_ptr=nx[3], eps=nx[4], NORM=normed is not None,
        ZC_IN=nz, r_ptr=rx[0], g_ptr=rx[1], u_ptr=rx[2], st_ptr=rx[3], RES=residual is not None,
        ZC=rz, bs_ptr=bscale, FP4=fp4, num_warps=cfg.warps, num_stages=1,
        **pdl_args(xb.device), **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
    )  # fmt: skip
    return y if residual is None else (y, u)


def compile_fp8_mma(
    config: Fp8MmaConfig,
    *,
    glu: bool,
    even: bool,
    swiglu_out: bool = False,
    arch: int = 90,
    row_words: int = 1024,
    norm: bool = False,
    residual: bool = False,
    fp4: bool = False,
) -> Any:
    """The kernel compiled for sm_<arch> without a GPU (kernels/compile_check.py), launched
    with programmatic dependent launch as on Hopper, for weight rows ``row_words`` 32-bit words
    apart (1024: fp8 K = 4096; nvfp4 (``fp4``) 512); ``norm`` / ``residual``: a `NormedX` input
    / `ResidualNorm` epilogue."""
    from kernels.compile_check import compile_for_cuda

    sig = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*fp32", "y_ptr": "*bf16"}
    sig |= {"N": "i32", "K": "i32"}
    sig |= {"xs_ptr": "*bf16", "gin_ptr": "*bf16", "st_in_ptr": "*fp32", "eps": "fp32"}
    sig |= {"r_ptr": "*bf16", "g_ptr": "*bf16", "u_ptr": "*fp16", "st_ptr": "*fp32"}
    const = {"GLU": glu, "SWIGLU": swiglu_out, "BN": config.bn, "R": 32 * config.warps}
    const |= {"EVEN": even, "PDL": True, "ROW_WORDS": row_words}
    const |= {"NORM": norm, "ZC_IN": False, "RES": residual, "ZC": False, "FP4": fp4}
    sig |= {"bs_ptr": "*u8"}
    divisible = ["x_ptr", "w_ptr", "s_ptr", "y_ptr", "K", "bs_ptr"]
    return compile_for_cuda(
        _fp8_mma_kernel, sig, const, divisible=divisible, num_warps=config.warps, arch=arch
    )

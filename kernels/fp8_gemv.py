"""Small-batch decode GEMV of an fp8 weight: y [M, N] = f(x) @ (s · e4m3(W))ᵀ, M <= 4.

W [N, K] e4m3 bytes (uint8 or float8_e4m3fn) with one fp32 scale per output row s [N], the
``fp8`` format of kernels/quant_gemm.py. The dense GEMV of kernels/gemv.py, fed bytes:

- a program owns BN weight rows and up to 4 rows of x; thread t holds K [16t, 16t + 16) of every
  one of its BN rows in each K chunk (BK = 16 * 32 * warps): one 16-byte load of weight bytes per
  row, two 16-byte loads of bf16 x shared by the BN rows;
- UNROLL chunks are loaded before any is used (UNROLL * BN 16-byte weight loads in flight per
  thread);
- the bytes are decoded in registers (hardware e4m3 conversion on CUDA, the exact bit trick of
  quant_decode under the interpreter), multiplied in fp32 and accumulated in fp32 (batch 1: one
  FMA per weight element; more rows: per-thread sums of 16 products); the row scale multiplies
  each row's sum once, at the end;
- GLU: x holds [gate | up] of width 2K and the input is silu(gate) * up, computed in registers
  (the SwiGLU of an MLP folded into its down projection).

Launch shapes (`Fp8GemvConfig`) per (N, K, glu, M) come from the H200 sweep
(fp8_gemv_table.json, written by ``bench/fp8_gemv_bench.py --write-table``): a measured shape is
in the table at the batch sizes where this kernel beat the older quant_gemv / tiled paths of
quant_linear, and `fp8_gemv_config` returns None for the others (quant_linear then takes its
older path). Unmeasured shapes use DEFAULT_M1 at batch 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.gemv import MAX_M, load_table, table_config, weight_chunk
from kernels.launch import hw_fp8, interpreting, pdl_args, pdl_wait
from kernels.quant_decode import fp8_bytes, fp8_raw_to_f32

VEC = 16  # K elements per thread per chunk: one 16-byte load of weight bytes


@triton.jit
def _x_half(x_row, k, K, m, M):
    """x [BK/16, 8] fp32 of row m at K offsets k (zero outside [0, K) or when m >= M)."""
    return tl.load(x_row + k, mask=(k < K) & (k * 0 + m < M), other=0.0).to(tl.float32)


@triton.jit
def _x_halves(x_row, k0, K, m, M, GLU: tl.constexpr, BK: tl.constexpr):
    """The K chunk [k0, k0 + BK) of one x row's input (silu(gate) * up with GLU) as two
    [BK/16, 8] fp32 halves: lo[i, j] = x[k0 + 16i + j], hi[i, j] = x[k0 + 16i + 8 + j]. Thread t
    holds row t of both (two 16-byte loads of bf16), the x values of its 16 weight bytes."""
    k = k0 + (tl.arange(0, BK // 16) * 16)[:, None] + tl.arange(0, 8)[None, :]  # [BK/16, 8]
    lo = _x_half(x_row, k, K, m, M)
    hi = _x_half(x_row, k + 8, K, m, M)
    if GLU:
        lo = lo * tl.sigmoid(lo) * _x_half(x_row + K, k, K, m, M)
        hi = hi * tl.sigmoid(hi) * _x_half(x_row + K, k + 8, K, m, M)
    return lo, hi


@triton.jit
def _acc_chunk(acc, x_row, k0, K, m, M, w_lo, w_hi, GLU: tl.constexpr,
               ELEMWISE: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    lo, hi = _x_halves(x_row, k0, K, m, M, GLU, BK)
    if ELEMWISE:
        out = acc + w_lo * lo[None, :, :] + w_hi * hi[None, :, :]  # [BN, BK/16, 8]
    else:
        out = acc + tl.sum(w_lo * lo[None, :, :] + w_hi * hi[None, :, :], axis=2)  # [BN, BK/16]
    return out


@triton.jit
def _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M, k0, K, raw, GLU: tl.constexpr,
              ELEMWISE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              HW: tl.constexpr):  # fmt: skip
    """Decode one K chunk's weight bytes raw [BN, BK] and add its products to the accumulators
    of the program's (up to 4) x rows."""
    w = fp8_raw_to_f32(raw, HW)  # [BN, BK], thread t: K [16t, 16t + 16)
    # the fp32 values split into the halves of x (a register renaming, no data movement)
    w_lo, w_hi = tl.split(tl.permute(tl.reshape(w, [BN, BK // 16, 2, 8]), (0, 1, 3, 2)))
    acc0 = _acc_chunk(acc0, x_row0, k0, K, m0, M, w_lo, w_hi, GLU, ELEMWISE, BK)
    if BM > 1:
        acc1 = _acc_chunk(acc1, x_row0 + stride_xm, k0, K, m0 + 1, M, w_lo, w_hi, GLU,
                          ELEMWISE, BK)  # fmt: skip
    if BM > 2:
        acc2 = _acc_chunk(acc2, x_row0 + 2 * stride_xm, k0, K, m0 + 2, M, w_lo, w_hi, GLU,
                          ELEMWISE, BK)  # fmt: skip
        acc3 = _acc_chunk(acc3, x_row0 + 3 * stride_xm, k0, K, m0 + 3, M, w_lo, w_hi, GLU,
                          ELEMWISE, BK)  # fmt: skip
    return acc0, acc1, acc2, acc3


@triton.jit
def _store_scaled(y_row, acc, sc, n, nmask, m, M):
    """y[m, n] = sum of the row's products (acc [BN, BK/16] or [BN, BK/16, 8]) * row scale
    sc [BN], if m < M."""
    if len(acc.shape) == 3:
        acc = tl.sum(acc, axis=2)
    y = tl.sum(acc, axis=1) * sc
    tl.store(y_row + n, y.to(y_row.dtype.element_ty), mask=nmask & (n * 0 + m < M))


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    UNROLL: tl.constexpr, EVEN: tl.constexpr, HW: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # grid (cdiv(N, BN), cdiv(M, BM)); thread t holds K [16t, 16t + 16) of all BN rows of the
    # byte tile [BN, BK] and the same K of each x row, as two [BK/16, 8] halves (_x_halves):
    # x [1, BK] in K order would be given 8 bf16 per thread by the compiler, a layout the bytes
    # could only reach through shared memory
    V: tl.constexpr = 16
    ELEMWISE: tl.constexpr = BM == 1
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    nmask = n < N
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    m0 = tl.program_id(1) * BM
    x_row0 = x_ptr + m0.to(tl.int64) * stride_xm
    kc = tl.max_contiguous(tl.multiple_of(tl.arange(0, BK), V), V)[None, :]
    if ELEMWISE:
        acc0 = tl.zeros([BN, BK // V, V // 2], dtype=tl.float32)
    else:
        acc0 = tl.zeros([BN, BK // V], dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    for k0 in range(0, K, BK * UNROLL):
        # every chunk's weight load is issued before the first one is decoded
        w_a = weight_chunk(w_rows, k0 + kc, nmask, K, EVEN)
        if UNROLL > 1:
            w_b = weight_chunk(w_rows, k0 + BK + kc, nmask, K, EVEN)
        if UNROLL > 2:
            w_c = weight_chunk(w_rows, k0 + 2 * BK + kc, nmask, K, EVEN)
            w_d = weight_chunk(w_rows, k0 + 3 * BK + kc, nmask, K, EVEN)
        pdl_wait(PDL)  # the first chunks' weight loads overlap the previous kernel's tail
        acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M, k0,
                                           K, w_a, GLU, ELEMWISE, BM, BN, BK, HW)  # fmt: skip
        if UNROLL > 1:
            acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                               k0 + BK, K, w_b, GLU, ELEMWISE, BM, BN, BK, HW)  # fmt: skip
        if UNROLL > 2:
            acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                               k0 + 2 * BK, K, w_c, GLU, ELEMWISE, BM, BN, BK, HW)  # fmt: skip
            acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                               k0 + 3 * BK, K, w_d, GLU, ELEMWISE, BM, BN, BK, HW)  # fmt: skip
    sc = tl.load(s_ptr + n, mask=nmask, other=0.0)
    y_row0 = y_ptr + m0.to(tl.int64) * stride_ym
    _store_scaled(y_row0, acc0, sc, n, nmask, m0, M)
    if BM > 1:
        _store_scaled(y_row0 + stride_ym, acc1, sc, n, nmask, m0 + 1, M)
    if BM > 2:
        _store_scaled(y_row0 + 2 * stride_ym, acc2, sc, n, nmask, m0 + 2, M)
        _store_scaled(y_row0 + 3 * stride_ym, acc3, sc, n, nmask, m0 + 3, M)


@dataclass(frozen=True)
class Fp8GemvConfig:
    """BN weight rows per program, num_warps (K chunk = 16 * 32 * warps), chunks loaded ahead
    (1, 2 or 4)."""

    bn: int
    warps: int
    unroll: int = 1

    @property
    def bk(self) -> int:
        return VEC * 32 * self.warps


TABLE_PATH = Path(__file__).with_name("fp8_gemv_table.json")
TABLE = load_table(TABLE_PATH, Fp8GemvConfig)  # read once at import
# Unmeasured shapes at batch 1 (a guess until the sweep measures them): 2 rows x 2 chunks, four
# 16-byte weight loads in flight per thread, the 64 bytes of quant_gemv's measured best (8 rows
# of 8 bytes, one chunk)
DEFAULT_M1 = Fp8GemvConfig(2, 4, 2)
INTERPRETED_M1 = Fp8GemvConfig(32, 1, 1)  # CPU interpreter: few programs, same arithmetic


def fp8_gemv_config(N: int, K: int, M: int, glu: bool = False) -> Fp8GemvConfig | None:
    """The launch shape for M rows of x against an [N, K] fp8 weight, or None where
    quant_linear's older path is the faster one (see kernels.gemv.table_config)."""
    return table_config(TABLE, N, K, M, glu, INTERPRETED_M1 if interpreting() else DEFAULT_M1)


def fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    config: Fp8GemvConfig,
    *,
    glu: bool = False,
) -> torch.Tensor:
    """y [M, N] in x.dtype = f(x) @ (scale[:, None] * e4m3(w))ᵀ, f(x) = x, or with ``glu``
    silu(x[:, :K]) * x[:, K:]. x [M, K or 2K] (bf16 / fp16 / fp32) and w [N, K] (uint8 or
    float8_e4m3fn) with contiguous last dims, scale [N] fp32. Any M works (programs take up to
    4 rows of x); it is meant for decode batches. No host synchronisation."""
    assert x.dim() == 2 and w.dim() == 2 and x.stride(-1) == 1 and w.stride(-1) == 1
    assert config.unroll in (1, 2, 4), config
    w = fp8_bytes(w)
    M = x.shape[0]
    N, K = w.shape
    assert x.shape[1] == (2 * K if glu else K), (x.shape, w.shape, glu)
    ok = scale.shape == (N,) and scale.dtype == torch.float32 and scale.stride(0) == 1
    assert ok, f"scale must be contiguous fp32 [{N}], got {scale.dtype} {tuple(scale.shape)}"
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    bm = 1 if M == 1 else 2 if M == 2 else MAX_M
    cfg = config
    even = K % (cfg.bk * cfg.unroll) == 0 and N % cfg.bn == 0
    _fp8_gemv_kernel[(triton.cdiv(N, cfg.bn), triton.cdiv(M, bm))](
        x, w, scale, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        GLU=glu, BM=bm, BN=cfg.bn, BK=cfg.bk, UNROLL=cfg.unroll, EVEN=even, HW=hw_fp8(),
        num_warps=cfg.warps, num_stages=1, **pdl_args(x.device),
    )  # fmt: skip
    return y


def compile_fp8_gemv(
    config: Fp8GemvConfig, *, glu: bool, bm: int, even: bool, pdl: bool = True, arch: int = 90
) -> Any:
    """The kernel compiled for sm_<arch> without launching it (no GPU needed; see
    kernels/compile_check.py): bf16 x and y, the launch shape of ``config``, BM rows of x per
    program, pointers, strides and K specialised as multiples of 16 as for the model shapes,
    launched with programmatic dependent launch (``pdl``) as on Hopper."""
    from kernels.compile_check import compile_for_cuda

    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*fp32", "y_ptr": "*bf16"}
    sig |= {a: "i32" for a in ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym")}
    const = {"GLU": glu, "BM": bm, "BN": config.bn, "BK": config.bk, "UNROLL": config.unroll}
    const |= {"EVEN": even, "HW": True, "PDL": pdl}
    divisible = [a for a in sig if a.endswith("_ptr") or a.startswith("stride") or a == "K"]
    return compile_for_cuda(
        _fp8_gemv_kernel, sig, const, divisible=divisible, num_warps=config.warps, arch=arch
    )


def fp8_gemv_reference(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, *, glu: bool = False
) -> torch.Tensor:
    """Torch reference of :func:`fp8_gemv`: the dequantised weight in fp32, fp32 matmul."""
    xf = x.float()
    if glu:
        g, u = xf.chunk(2, dim=-1)
        xf = torch.nn.functional.silu(g) * u
    wf = fp8_bytes(w).view(torch.float8_e4m3fn).float() * scale.float()[:, None]
    return (xf @ wf.t()).to(x.dtype)

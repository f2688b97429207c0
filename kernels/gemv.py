"""Small-batch decode GEMV of a dense (bf16 / fp16 / fp32) weight: y [M, N] = f(x) @ Wᵀ, M <= 4.

cuBLAS picks split-K kernels for the narrow decode shapes (Qwen3-8B q/k/v, o and down ran at
72-87 % of the copy rate on the H200, each split-K launch followed by a reduce kernel). This
kernel streams the weight once with every load 16 bytes wide and no second pass:

- a program owns BN weight rows and up to 4 rows of x; thread t holds K [8t, 8t + 8) of every one
  of its BN rows in each K chunk (BK = 8 * 32 * warps), multiplies in fp32 and accumulates in
  fp32 (batch 1: one FMA per weight element; more rows: per-thread sums of 8 products);
- UNROLL chunks are loaded before any is used, so each thread keeps UNROLL * BN 16-byte loads in
  flight (the memory-level parallelism a 10 us kernel needs to reach the bandwidth);
- GLU: x holds [gate | up] of width 2K and the kernel's input is silu(gate) * up, computed in
  registers (the SwiGLU of an MLP folded into its down projection: one launch and one round trip
  of the activation fewer).

Launch shapes (`DenseGemvConfig`) come from the H200 sweep (gemv_table.json, written by
``bench/dense_gemv_bench.py --write-table``); a shape is in the table only where this kernel beat
cuBLAS there. The compiler reads the table and the plan names the kernel and shape each GEMM
runs with per number of rows (ninfer/passes/gemm_launch.py); this module only launches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.launch import WEIGHT_EVICT, f32_dot, pdl_args, pdl_wait

VEC = 8  # K elements per thread per chunk: one 16-byte load of bf16
MAX_M = 4  # rows of x one program takes


@triton.jit
def _x_chunk(x_row, k, ok, K, GLU: tl.constexpr):
    """[1, BK] fp32 input of one x row at K offsets k (zero where not ok)."""
    if GLU:
        g = tl.load(x_row + k, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_row + K + k, mask=ok, other=0.0).to(tl.float32)
        x = g * tl.sigmoid(g) * u
    else:
        x = tl.load(x_row + k, mask=ok, other=0.0).to(tl.float32)
    return x


@triton.jit
def weight_chunk(w_rows, k, nmask, K, EVEN: tl.constexpr):
    """The weight tile at K offsets k of rows w_rows (zero outside the matrix unless EVEN);
    any element type (kernels/fp8_gemv.py loads e4m3 bytes with it)."""
    if EVEN:
        w = tl.load(w_rows + k, eviction_policy=WEIGHT_EVICT)
    else:
        w = tl.load(
            w_rows + k, mask=nmask[:, None] & (k < K), other=0.0, eviction_policy=WEIGHT_EVICT
        )
    return w


@triton.jit
def _acc_chunk(
    acc, x_row, k, ok, K, w, GLU: tl.constexpr, ELEMWISE: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    x = _x_chunk(x_row, k, ok, K, GLU)
    if ELEMWISE:
        out = acc + w * x  # [BN, BK]
    else:
        out = acc + tl.sum(tl.reshape(w * x, [BN, BK // V, V]), axis=2)  # [BN, BK / V]
    return out


@triton.jit
def _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M, k, kmask, K, wraw,
              GLU: tl.constexpr, ELEMWISE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, V: tl.constexpr):  # fmt: skip
    """Add one K chunk's products to the accumulators of the program's (up to 4) x rows."""
    w = wraw.to(tl.float32)
    acc0 = _acc_chunk(acc0, x_row0, k, kmask & (k * 0 + m0 < M), K, w, GLU, ELEMWISE, BN, BK, V)
    if BM > 1:
        ok1 = kmask & (k * 0 + m0 + 1 < M)
        acc1 = _acc_chunk(acc1, x_row0 + stride_xm, k, ok1, K, w, GLU, ELEMWISE, BN, BK, V)
    if BM > 2:
        ok2 = kmask & (k * 0 + m0 + 2 < M)
        acc2 = _acc_chunk(acc2, x_row0 + 2 * stride_xm, k, ok2, K, w, GLU, ELEMWISE, BN, BK, V)
        ok3 = kmask & (k * 0 + m0 + 3 < M)
        acc3 = _acc_chunk(acc3, x_row0 + 3 * stride_xm, k, ok3, K, w, GLU, ELEMWISE, BN, BK, V)
    return acc0, acc1, acc2, acc3


@triton.jit
def _store_row(y_row, acc, n, nmask, m, M):
    tl.store(
        y_row + n, tl.sum(acc, axis=1).to(y_row.dtype.element_ty), mask=nmask & (n * 0 + m < M)
    )


@triton.jit
def _dense_gemv_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    UNROLL: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # grid (cdiv(N, BN), cdiv(M, BM)); x [1, BK] and the weight tile [BN, BK] share a layout:
    # thread t holds K [8t, 8t + 8) of all BN rows
    V: tl.constexpr = 8
    ELEMWISE: tl.constexpr = BM == 1
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    nmask = n < N
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    m0 = tl.program_id(1) * BM
    x_row0 = x_ptr + m0.to(tl.int64) * stride_xm
    kc = tl.max_contiguous(tl.multiple_of(tl.arange(0, BK), V), V)[None, :]
    if ELEMWISE:
        acc0 = tl.zeros([BN, BK], dtype=tl.float32)
    else:
        acc0 = tl.zeros([BN, BK // V], dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    for k0 in range(0, K, BK * UNROLL):
        # every chunk's weight load is issued before the first one is used
        k_a = k0 + kc
        w_a = weight_chunk(w_rows, k_a, nmask, K, EVEN)
        if UNROLL > 1:
            k_b = k_a + BK
            w_b = weight_chunk(w_rows, k_b, nmask, K, EVEN)
        if UNROLL > 2:
            k_c = k_b + BK
            k_d = k_c + BK
            w_c = weight_chunk(w_rows, k_c, nmask, K, EVEN)
            w_d = weight_chunk(w_rows, k_d, nmask, K, EVEN)
        pdl_wait(PDL)  # the first chunks' weight loads overlap the previous kernel's tail
        acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                           k_a, k_a < K, K, w_a, GLU, ELEMWISE, BM, BN, BK, V)  # fmt: skip
        if UNROLL > 1:
            acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                               k_b, k_b < K, K, w_b, GLU, ELEMWISE, BM, BN, BK, V)  # fmt: skip
        if UNROLL > 2:
            acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                               k_c, k_c < K, K, w_c, GLU, ELEMWISE, BM, BN, BK, V)  # fmt: skip
            acc0, acc1, acc2, acc3 = _acc_rows(acc0, acc1, acc2, acc3, x_row0, stride_xm, m0, M,
                                               k_d, k_d < K, K, w_d, GLU, ELEMWISE, BM, BN, BK, V)  # fmt: skip
    y_row0 = y_ptr + m0.to(tl.int64) * stride_ym
    _store_row(y_row0, acc0, n, nmask, m0, M)
    if BM > 1:
        _store_row(y_row0 + stride_ym, acc1, n, nmask, m0 + 1, M)
    if BM > 2:
        _store_row(y_row0 + 2 * stride_ym, acc2, n, nmask, m0 + 2, M)
        _store_row(y_row0 + 3 * stride_ym, acc3, n, nmask, m0 + 3, M)


@dataclass(frozen=True)
class DenseGemvConfig:
    """BN weight rows per program, num_warps (K chunk = 8 * 32 * warps), chunks loaded ahead."""

    bn: int
    warps: int
    unroll: int = 1

    @property
    def bk(self) -> int:
        return VEC * 32 * self.warps


TABLE_PATH = Path(__file__).with_name("gemv_table.json")


def load_table(path: Path = TABLE_PATH, config_type: type = DenseGemvConfig) -> dict:
    """{(N, K, glu, M): config_type(bn, warps, unroll)} for the weights and batch sizes (M = 1,
    2, 4) where the H200 sweep found the GEMV faster than the path it replaces, and
    (N, K, glu, 0): None for every measured weight (an empty entry: the other path won at every
    M). File format: {"N:K:glu": {"M": [bn, warps, unroll]}}, glu 0 or 1 (also
    kernels/fp8_gemv_table.json; other tables' fields are config_type's, in order)."""
    if not path.exists():
        return {}
    table = {}
    for key, per_m in json.loads(path.read_text()).items():
        n, k, glu = (int(v) for v in key.split(":"))
        table[(n, k, bool(glu), 0)] = None
        for m, fields in per_m.items():
            table[(n, k, bool(glu), int(m))] = config_type(*(int(v) for v in fields))
    return table


INTERPRETED_M1 = DenseGemvConfig(32, 1, 1)  # CPU interpreter: few programs, same arithmetic


def table_config(table: dict, N: int, K: int, M: int, glu: bool, default_m1: Any) -> Any:
    """The launch shape `table` (see load_table) gives M rows of x against an [N, K] weight, or
    None: the other path. Measured shapes: the entry for M rounded up to 1, 2 or 4 (none: the
    other path won there); other shapes: ``default_m1`` at batch 1, the other path above."""
    if M > MAX_M:
        return None
    bucket = 1 if M == 1 else 2 if M == 2 else MAX_M
    if any((N, K, glu, m) in table for m in (0, 1, 2, MAX_M)):
        return table.get((N, K, glu, bucket))
    return default_m1 if M == 1 else None


def dense_gemv(
    x: torch.Tensor, w: torch.Tensor, config: DenseGemvConfig, *, glu: bool = False
) -> torch.Tensor:
    """y [M, N] in x.dtype = x @ wᵀ (glu: silu(x[:, :K]) * x[:, K:] @ wᵀ), x [M, K or 2K] and
    w [N, K] with contiguous last dims, 1 <= M <= 4 rows per program (any M works; it is meant
    for decode batches)."""
    assert x.dim() == 2 and w.dim() == 2 and x.stride(-1) == 1 and w.stride(-1) == 1
    assert config.unroll in (1, 2, 4), config
    M = x.shape[0]
    N, K = w.shape
    assert x.shape[1] == (2 * K if glu else K), (x.shape, w.shape, glu)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    bm = 1 if M == 1 else 2 if M == 2 else MAX_M
    cfg = config
    even = K % (cfg.bk * cfg.unroll) == 0 and N % cfg.bn == 0
    _dense_gemv_kernel[(triton.cdiv(N, cfg.bn), triton.cdiv(M, bm))](
        x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        GLU=glu, BM=bm, BN=cfg.bn, BK=cfg.bk, UNROLL=cfg.unroll, EVEN=even,
        num_warps=cfg.warps, num_stages=1, **pdl_args(x.device),
    )  # fmt: skip
    return y


def dense_gemv_reference(x: torch.Tensor, w: torch.Tensor, *, glu: bool = False) -> torch.Tensor:
    """Torch reference of :func:`dense_gemv` (fp32 math, x.dtype result)."""
    xf = x.float()
    if glu:
        g, u = xf.chunk(2, dim=-1)
        xf = torch.nn.functional.silu(g) * u
    return (xf @ w.float().t()).to(x.dtype)


# -- 4 < M <= 16: tensor-core tiles, one 16-row tile of x against BN weight rows -----------------


@triton.jit
def _skinny_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, F32_DOT: tl.constexpr,
):  # fmt: skip
    # grid (cdiv(N, BN),): the program streams its BN weight rows once through STAGES
    # pipelined [BN, BK] tiles (asynchronous copies) into a 16-row tensor-core product
    BM: tl.constexpr = 16
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    nmask = n < N
    mmask = m < M
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    kk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        k = k0 + kk
        kmask = k < K
        x = tl.load(x_rows + k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        if F32_DOT:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    y_ptrs = y_ptr + m.to(tl.int64)[:, None] * stride_ym + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@dataclass(frozen=True)
class SkinnyConfig:
    """BN weight rows per program, K tile, pipeline stages, num_warps."""

    bn: int
    bk: int
    stages: int
    warps: int = 4


SKINNY_MAX_M = 16
SKINNY_TABLE_PATH = Path(__file__).with_name("skinny_table.json")


def dense_skinny(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig) -> torch.Tensor:
    """y [M, N] in x.dtype = x @ wᵀ for M <= 16 on tensor cores; x [M, K], w [N, K] with
    contiguous last dims and the same dtype."""
    assert x.dim() == 2 and w.dim() == 2 and x.stride(-1) == 1 and w.stride(-1) == 1
    M, K = x.shape
    N = w.shape[0]
    assert M <= SKINNY_MAX_M and w.shape[1] == K and x.dtype == w.dtype, (x.shape, w.shape)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    c = config
    _skinny_kernel[(triton.cdiv(N, c.bn),)](
        x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        BN=c.bn, BK=c.bk, STAGES=c.stages, F32_DOT=f32_dot(x.dtype), num_warps=c.warps,
    )  # fmt: skip
    return y

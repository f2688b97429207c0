"""Small-batch decode GEMV of the weight-only quantised linear (kernels/quant_gemm.py).

y [M, N] = x [M, K] @ dequant(W)ᵀ for M <= 4, on CUDA cores. Weight formats as in quant_gemm.

Each program owns BN weight rows and up to 4 rows of x and streams K; a thread holds 8
consecutive K of every one of its BN rows (one 16-byte load of x, reused across the rows; 8 fp8 /
4 nvfp4 bytes of W per row), decodes in registers (fp8: hardware e4m3 conversion; nvfp4: four
bytes at a time through e4m3, see quant_decode.e2m1_pairs_to_f32), multiplies in fp32 and
accumulates in fp32; nvfp4 sums each 8-value half block before its e4m3 block scale. No atomics,
no second pass.

Launch shapes (`GemvConfig`) come from the table measured on the H200 (quant_gemm_table.json,
read once at import by `load_gemv_table`), else from `_gemv_default`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernels.launch import hw_fp8
from kernels.quant_decode import e2m1_pairs_to_f32, fp8_raw_to_f32

GEMV_VEC = 8  # K elements a GEMV thread holds per chunk: one 16-byte load of bf16 x


@triton.jit
def _gemv_load_w(w_rows, k0, kw, nmask, K, FMT: tl.constexpr, EVEN: tl.constexpr):
    """Raw weight bytes [BN, BK] (fp8) or [BN, BK/2] (nvfp4) of the K chunk starting at k0;
    zero outside the matrix."""
    if FMT == 0:
        kb = k0 + kw
        kmax = K
    else:
        kb = k0 // 2 + kw
        kmax = K // 2
    if EVEN:
        return tl.load(w_rows + kb, mask=kw * 0 + k0 < K, other=0)
    return tl.load(w_rows + kb, mask=nmask[:, None] & (kb < kmax), other=0)


@triton.jit
def _gemv_row(
    x_row,
    k0,
    kk,
    row_ok,
    K,
    w,
    sc,
    acc,
    FMT: tl.constexpr,
    EVEN: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    V: tl.constexpr,
    ELEMWISE: tl.constexpr,
):
    """acc + one x row's contribution of this K chunk; w [BN, BK] fp32 decoded weight.
    acc is [BN, BK] (fp8, one x row per program: a bare FMA per element) or [BN, BK/V]
    (sums of V consecutive products; nvfp4 scales them by their block scale sc)."""
    if EVEN:
        x = tl.load(x_row + k0 + kk, mask=row_ok, other=0.0).to(tl.float32)
    else:
        x = tl.load(x_row + k0 + kk, mask=row_ok & (k0 + kk < K), other=0.0).to(tl.float32)
    if ELEMWISE:
        out = acc + w * x  # [BN, BK]
    else:
        part = tl.sum(tl.reshape(w * x, [BN, BK // V, V]), axis=2)  # [BN, BK/V]
        if FMT == 1:
            part = part * sc  # e4m3 block scale of each half block
        out = acc + part
    return out


@triton.jit
def _wq_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    rs_ptr,
    y_ptr,
    M,
    N,
    K,
    gscale,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_ym,
    FMT: tl.constexpr,
    HAS_RS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN: tl.constexpr,
    ELEMWISE: tl.constexpr,
    HW: tl.constexpr,
):
    # grid (cdiv(N, BN), cdiv(M, BM)); BK = V * 32 * num_warps so that x [1, BK] and the weight
    # tile [BN, BK] get the same register layout: thread t holds K [8t, 8t + 8) of all BN rows
    V: tl.constexpr = 8
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < N
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    m0 = pid_m * BM
    x_row0 = x_ptr + m0.to(tl.int64) * stride_xm
    kk = tl.arange(0, BK)[None, :]
    if FMT == 0:
        kw = tl.max_contiguous(tl.arange(0, BK), V)[None, :]
        if ELEMWISE:
            acc0 = tl.zeros([BN, BK], dtype=tl.float32)
        else:
            acc0 = tl.zeros([BN, BK // V], dtype=tl.float32)
    else:
        kw = tl.max_contiguous(tl.arange(0, BK // 2), V // 2)[None, :]
        kv = tl.arange(0, BK // V)[None, :] // 2  # half block -> block within the chunk
        acc0 = tl.zeros([BN, BK // V], dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    raw = _gemv_load_w(w_rows, 0, kw, nmask, K, FMT, EVEN)
    for k0 in range(0, K, BK):
        if PREFETCH:
            nxt = _gemv_load_w(w_rows, k0 + BK, kw, nmask, K, FMT, EVEN)
        else:
            raw = _gemv_load_w(w_rows, k0, kw, nmask, K, FMT, EVEN)
        if FMT == 0:
            w = fp8_raw_to_f32(raw, HW)  # [BN, BK]
            sc = w  # unused
        else:
            lo, hi = e2m1_pairs_to_f32(raw, HW)  # [BN, BK/2] each, values / 64
            w = tl.reshape(tl.join(lo, hi), [BN, BK])  # natural K order
            sidx = k0 // 16 + kv
            sp = s_ptr + n.to(tl.int64)[:, None] * stride_sn + sidx
            if EVEN:
                sraw = tl.load(sp)
            else:
                sraw = tl.load(sp, mask=nmask[:, None] & (sidx < K // 16), other=0)
            sc = fp8_raw_to_f32(sraw, HW)  # [BN, BK/V]
        acc0 = _gemv_row(
            x_row0, k0, kk, kk * 0 + m0 < M, K, w, sc, acc0, FMT, EVEN, BN, BK, V, ELEMWISE
        )
        if BM > 1:
            acc1 = _gemv_row(
                x_row0 + stride_xm,
                k0,
                kk,
                kk * 0 + m0 + 1 < M,
                K,
                w,
                sc,
                acc1,
                FMT,
                EVEN,
                BN,
                BK,
                V,
                ELEMWISE,
            )
        if BM > 2:
            acc2 = _gemv_row(
                x_row0 + 2 * stride_xm,
                k0,
                kk,
                kk * 0 + m0 + 2 < M,
                K,
                w,
                sc,
                acc2,
                FMT,
                EVEN,
                BN,
                BK,
                V,
                ELEMWISE,
            )
            acc3 = _gemv_row(
                x_row0 + 3 * stride_xm,
                k0,
                kk,
                kk * 0 + m0 + 3 < M,
                K,
                w,
                sc,
                acc3,
                FMT,
                EVEN,
                BN,
                BK,
                V,
                ELEMWISE,
            )
        if PREFETCH:
            raw = nxt
    if HAS_RS:
        rs = tl.load(rs_ptr + n, mask=nmask, other=0.0) * gscale
    else:
        rs = gscale
    y_row0 = y_ptr + m0.to(tl.int64) * stride_ym + n
    out_ty = y_ptr.dtype.element_ty
    tl.store(y_row0, (tl.sum(acc0, axis=1) * rs).to(out_ty), mask=nmask & (n * 0 + m0 < M))
    if BM > 1:
        tl.store(
            y_row0 + stride_ym,
            (tl.sum(acc1, axis=1) * rs).to(out_ty),
            mask=nmask & (n * 0 + m0 + 1 < M),
        )
    if BM > 2:
        tl.store(
            y_row0 + 2 * stride_ym,
            (tl.sum(acc2, axis=1) * rs).to(out_ty),
            mask=nmask & (n * 0 + m0 + 2 < M),
        )
        tl.store(
            y_row0 + 3 * stride_ym,
            (tl.sum(acc3, axis=1) * rs).to(out_ty),
            mask=nmask & (n * 0 + m0 + 3 < M),
        )


@dataclass(frozen=True)
class GemvConfig:
    """Launch shape of the GEMV kernel: BN weight rows per program, num_warps (K chunk =
    8 * 32 * warps), software prefetch of the next chunk's weight bytes."""

    bn: int
    warps: int
    prefetch: bool = False

    @property
    def bk(self) -> int:
        return GEMV_VEC * 32 * self.warps


GEMV_TABLE_PATH = Path(__file__).with_name("quant_gemm_table.json")


def load_gemv_table(path: Path = GEMV_TABLE_PATH) -> dict[tuple[str, int, int], GemvConfig]:
    """{(fmt, N, K): GemvConfig} measured on the H200 by ``bench/gemv_bench.py --write-table``
    (bench/results/gemv_h200.md) for the projection shapes of the models we serve; shapes not in
    it use _gemv_default. File format: {"fmt:N:K": [bn, warps, prefetch]}."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    table = {}
    for key, (bn, warps, prefetch) in raw.items():
        fmt, n, k = key.split(":")
        table[(fmt, int(n), int(k))] = GemvConfig(int(bn), int(warps), bool(prefetch))
    return table


GEMV_TABLE = load_gemv_table()  # read once at import


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; off CUDA (the interpreter) an H200's 132."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _gemv_default(fmt: str, N: int, K: int, sms: int) -> GemvConfig:
    """8 (fp8) or 4 (nvfp4) weight rows per program (the best of the H200 sweep for most
    shapes), fewer when that would leave fewer than two programs per multiprocessor."""
    bn = 8 if fmt == "fp8" else 4  # nvfp4 is issue-bound: more, smaller programs win
    while bn > 1 and triton.cdiv(N, bn) < 2 * sms:
        bn //= 2
    return GemvConfig(bn, 4)


def gemv_config(fmt: str, N: int, K: int, device: torch.device) -> GemvConfig:
    """The launch shape for an (fmt, N, K) weight: the measured table entry, else the default."""
    return GEMV_TABLE.get((fmt, N, K)) or _gemv_default(fmt, N, K, sm_count(device))


def launch_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    rs: torch.Tensor,
    *,
    fmt: str,
    gscale: float,
    has_rs: bool,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """y [M, N] (x.dtype) by the GEMV kernel, M >= 1 (each program takes up to 4 rows of x;
    quant_linear sends M <= GEMV_MAX_M[fmt] here).

    Arguments as quant_linear prepares them: x [M, K] with contiguous last dim, w and scale raw
    bytes (uint8), rs the [N] fp32 row scale when ``has_rs`` (any valid pointer otherwise),
    gscale the scalar global scale. ``config`` forces the launch shape; without it the table or
    default shape is used (capped at 8 rows and no prefetch when M > 1)."""
    M, K = x.shape
    N = w.shape[0]
    stride_sn = scale.stride(0) if scale.dim() == 2 else 0
    cfg = config or gemv_config(fmt, N, K, x.device)
    bm = 1 if M == 1 else 2 if M == 2 else 4
    if config is None and bm > 1 and (cfg.bn > 8 or cfg.prefetch):
        cfg = GemvConfig(min(cfg.bn, 8), cfg.warps)  # registers for 2-4 accumulators
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    even = K % cfg.bk == 0 and N % cfg.bn == 0
    _wq_gemv_kernel[(triton.cdiv(N, cfg.bn), triton.cdiv(M, bm))](
        x,
        w,
        scale,
        rs,
        y,
        M,
        N,
        K,
        gscale * (64.0 if fmt == "nvfp4" else 1.0),
        x.stride(0),
        w.stride(0),
        stride_sn,
        y.stride(0),
        FMT=0 if fmt == "fp8" else 1,
        HAS_RS=has_rs,
        BM=bm,
        BN=cfg.bn,
        BK=cfg.bk,
        PREFETCH=cfg.prefetch,
        EVEN=even,
        ELEMWISE=fmt == "fp8" and bm == 1,
        HW=hw_fp8(),
        num_warps=cfg.warps,
        num_stages=1,
    )
    return y

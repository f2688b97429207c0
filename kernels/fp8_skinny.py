"""Tensor-core tiles of 5..16 rows of x against an fp8 weight: y [M, N] = x @ (s · e4m3(W))ᵀ.

W [N, K] e4m3 bytes (uint8 or float8_e4m3fn) with one fp32 scale per output row s [N], the
``fp8`` format of kernels/quant_gemm.py. The bf16 skinny tiles of kernels/gemv.py, fed bytes:
a program owns BN weight rows and streams them once, in [BN, BK] byte tiles through STAGES
pipelined asynchronous copies, into one 16-row tensor-core product per tile. The bytes are
decoded to x's dtype in registers (the hardware e4m3 conversion on CUDA, the exact bit trick of
quant_decode under the interpreter); products accumulate in fp32 and the row scale multiplies
each output column once, at the end. Half the weight bytes of the bf16 tiles for the same
product: what a memory-bound 16-row call (a DFlash drafter's block) pays.

Launch shapes (`Fp8SkinnyConfig`) per (N, K, rows bucket 8 or 16) come from the H200 sweep
(fp8_skinny_table.json, written by ``python -m bench.fp8_skinny_bench --write-table``) where
they beat quant_linear's fp8 tiles; `fp8_skinny_config` gives the measured shape's entry, else
the entry of the nearest measured width of the same depth, else DEFAULT; None (quant_linear)
where the sweep found quant_linear's tiles faster.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernels.launch import f32_dot, hw_fp8
from kernels.quant_decode import fp8_bytes, fp8_raw_to_f32

MAX_M = 16
TABLE_PATH = Path(__file__).with_name("fp8_skinny_table.json")


@triton.jit
def _fp8_skinny_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, F32_DOT: tl.constexpr,
    HW: tl.constexpr,
):  # fmt: skip
    # grid (cdiv(N, BN),): one 16-row tile of x against the program's BN weight rows
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
        raw = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
        if F32_DOT:
            w = fp8_raw_to_f32(raw, HW)
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            w = raw.to(tl.float8e4nv, bitcast=True).to(x.dtype)
            acc += tl.dot(x, tl.trans(w))
    acc *= tl.load(s_ptr + n, mask=nmask, other=0.0)[None, :]
    y_ptrs = y_ptr + m.to(tl.int64)[:, None] * stride_ym + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@dataclass(frozen=True)
class Fp8SkinnyConfig:
    """BN weight rows per program, K tile (bytes), pipeline stages, num_warps."""

    bn: int
    bk: int
    stages: int
    warps: int = 4


DEFAULT = Fp8SkinnyConfig(32, 256, 4, 4)


def fp8_skinny(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, config: Fp8SkinnyConfig = DEFAULT
) -> torch.Tensor:
    """y [M, N] in x.dtype = x @ (scale[:, None] * e4m3(w))ᵀ for M <= 16; x [M, K] and w [N, K]
    (e4m3 bytes) with contiguous last dims, scale [N] contiguous fp32."""
    w = fp8_bytes(w)
    assert x.dim() == 2 and w.dim() == 2 and x.stride(-1) == 1 and w.stride(-1) == 1
    M, K = x.shape
    N = w.shape[0]
    assert M <= MAX_M and w.shape[1] == K, (x.shape, w.shape)
    ok = scale.shape == (N,) and scale.dtype == torch.float32 and scale.stride(0) == 1
    assert ok, f"scale must be contiguous fp32 [{N}], got {scale.dtype} {tuple(scale.shape)}"
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    c = config
    _fp8_skinny_kernel[(triton.cdiv(N, c.bn),)](
        x, w, scale, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        BN=c.bn, BK=c.bk, STAGES=c.stages, F32_DOT=f32_dot(x.dtype), HW=hw_fp8(),
        num_warps=c.warps,
    )  # fmt: skip
    return y


def fp8_skinny_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Torch reference of :func:`fp8_skinny` (fp32 math)."""
    wf = fp8_bytes(w).view(torch.float8_e4m3fn).float() * scale.float()[:, None]
    return (x.float() @ wf.T).to(x.dtype)


@functools.cache
def load_table(path: Path | None = None) -> dict[tuple[int, int, int], Fp8SkinnyConfig | None]:
    """{(N, K, bucket): config} where the sweep found these tiles faster than quant_linear's,
    and (N, K, 0): None for every measured weight. File format {"N:K": {"bucket": [bn, bk,
    stages, warps]}} (an empty entry: quant_linear won at both buckets)."""
    path = path or TABLE_PATH
    if not path.exists():
        return {}
    table: dict[tuple[int, int, int], Fp8SkinnyConfig | None] = {}
    for key, per_m in json.loads(path.read_text()).items():
        n, k = (int(v) for v in key.split(":"))
        table[(n, k, 0)] = None
        for m, f in per_m.items():
            table[(n, k, int(m))] = Fp8SkinnyConfig(*(int(v) for v in f))
    return table


def fp8_skinny_config(N: int, K: int, M: int) -> Fp8SkinnyConfig | None:
    """The launch shape for M (5..16) rows against an [N, K] fp8 weight, or None where
    quant_linear's tiles are faster: a measured shape's entry; for another shape, the entry of
    the nearest measured width of the same depth (by bit length), or DEFAULT at a depth the
    sweep never measured."""
    table = load_table()
    bucket = 8 if M <= 8 else 16
    if (N, K, 0) not in table:
        near = [(abs(n.bit_length() - N.bit_length()), n) for n, k, b in table if k == K and b == 0]  # fmt: skip
        if not near:
            return DEFAULT
        N = min(near)[1]
    return table.get((N, K, bucket))

"""kernels/gemv.py's 16-row tensor-core tiles (`dense_skinny`), launched with programmatic
dependent launch and optionally with a SwiGLU input, for chains of few-row GEMMs in a CUDA
Graph (the DFlash drafter's block forward: 16 rows a round).

Contract: y [M, N] in x.dtype = f(x) @ wᵀ for M <= 16 rows; w [N, K], x [M, K], or with
glu=True x [M, 2K] = [gate | up] and f(x) = silu(gate) * up, computed in fp32 and rounded to
w's dtype before the product (as kernels.silu_mul would round it), so an MLP's down
projection reads its gate/up output directly: one launch and one round trip fewer.

The loop is dense_skinny's (same tiles, same launch shapes from kernels/skinny_table.json);
the difference is the launch: with pdl=True (kernels/launch.py) the programs are placed while
the kernel before finishes and wait in `pdl_wait` before their first load, so a chain of short
kernels loses less to launch gaps. Not between two of these GEMMs of several waves each: on the
H200 a DFlash round whose gate/up tiles (384 programs) fed the SwiGLU-input down projection
(both with PDL) took 1.91 ms against 0.70 ms with a plain silu_mul launch between them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gemv import SKINNY_MAX_M, SkinnyConfig
from kernels.launch import f32_dot, pdl_args, pdl_wait


@triton.jit
def _skinny_pdl_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, F32_DOT: tl.constexpr,
    GLU: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    BM: tl.constexpr = 16
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    nmask = n < N
    mmask = m < M
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    kk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    pdl_wait(PDL)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        k = k0 + kk
        kmask = k < K
        xmask = mmask[:, None] & kmask[None, :]
        if GLU:
            g = tl.load(x_rows + k[None, :], mask=xmask, other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + k[None, :], mask=xmask, other=0.0).to(tl.float32)
            x = (g * tl.sigmoid(g) * u).to(w_ptr.dtype.element_ty)
        else:
            x = tl.load(x_rows + k[None, :], mask=xmask, other=0.0)
        w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        if F32_DOT:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    y_ptrs = y_ptr + m.to(tl.int64)[:, None] * stride_ym + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def skinny_pdl(
    x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig, *, glu: bool = False, pdl: bool = True
) -> torch.Tensor:
    """y [M, N] (module docstring); x [M, K] ([M, 2K] with glu) and w [N, K] with contiguous
    last dims and the same dtype, M <= 16; pdl: launched with programmatic dependent launch
    where the device has it."""
    assert x.dim() == 2 and w.dim() == 2 and x.stride(-1) == 1 and w.stride(-1) == 1
    M = x.shape[0]
    N, K = w.shape
    assert M <= SKINNY_MAX_M and x.dtype == w.dtype, (x.shape, w.shape)
    assert x.shape[1] == (2 * K if glu else K), (x.shape, w.shape, glu)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    c = config
    _skinny_pdl_kernel[(triton.cdiv(N, c.bn),)](
        x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        BN=c.bn, BK=c.bk, STAGES=c.stages, F32_DOT=f32_dot(x.dtype), GLU=glu,
        num_warps=c.warps, **(pdl_args(x.device) if pdl else {"PDL": False}),
    )  # fmt: skip
    return y

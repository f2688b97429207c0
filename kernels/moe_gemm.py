"""Grouped GEMM for routed MoE experts: rows sorted by expert, one weight matrix per expert.

Contract:
    x            [T, K] activations (one row per token)
    w            [E, N, K] expert weights (bf16/fp16/fp32), y_e = x @ w[e]ᵀ
    sorted_rows  [S] int32: the x row of each sorted slot (S = T * top_k assignments)
    expert_offsets [E+1] int32: slots expert_offsets[e] : expert_offsets[e+1] belong to expert e
    y            [S, N] in x.dtype: y[s] = x[sorted_rows[s]] @ w[e(s)]ᵀ

Each program owns BM slots of a single expert. The tile -> expert map is derived on the device
from the per-expert tile counts (no host sync, CUDA-graph safe): the grid is the static upper
bound cdiv(S, BM) + E tiles and surplus programs exit at once. :func:`moe_sort` builds the
sorted order from router top-k ids.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.launch import f32_dot


class MoeSort(NamedTuple):
    sorted_rows: torch.Tensor  # [T*k] int32: token of each slot
    slot_of: torch.Tensor  # [T, k] int64: slot holding assignment (t, j)
    expert_offsets: torch.Tensor  # [E+1] int32


def moe_sort(topk_ids: torch.Tensor, num_experts: int) -> MoeSort:
    """Sort the T*k (token, expert) assignments by expert (stable, token order within one)."""
    T, k = topk_ids.shape
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)  # slot -> assignment index
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=topk_ids.device)
    offsets[1:] = counts.cumsum(0)
    slot_of = torch.empty_like(order)
    slot_of[order] = torch.arange(order.numel(), device=order.device)
    return MoeSort((order // k).to(torch.int32), slot_of.view(T, k), offsets)


@triton.jit
def _moe_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rows_ptr,
    off_ptr,
    tiles_cum_ptr,
    E,
    N,
    K,
    stride_xt,
    stride_we,
    stride_wn,
    stride_ys,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    BLOCK_E: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    es = tl.arange(0, BLOCK_E)
    cum = tl.load(tiles_cum_ptr + es, mask=es < E, other=2147483647)  # inclusive tile cumsum
    e = tl.sum((cum <= tile).to(tl.int32), axis=0)
    if e >= E:
        return
    first_tile = tl.sum(tl.where(es == e - 1, cum, 0), axis=0)  # cum[e-1], 0 for e == 0
    row_start = tl.load(off_ptr + e) + (tile - first_tile) * BM
    row_end = tl.load(off_ptr + e + 1)
    s = row_start + tl.arange(0, BM)
    smask = s < row_end
    src = tl.load(rows_ptr + s, mask=smask, other=0).to(tl.int64)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < N
    kk = tl.arange(0, BK)
    w_rows = w_ptr + e.to(tl.int64) * stride_we + n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + kk
        kmask = k < K
        x = tl.load(
            x_ptr + src[:, None] * stride_xt + k[None, :],
            mask=smask[:, None] & kmask[None, :],
            other=0.0,
        )
        w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        if F32_DOT:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    y_ptrs = y_ptr + s.to(tl.int64)[:, None] * stride_ys + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=smask[:, None] & nmask[None, :])


def moe_gemm(
    x: torch.Tensor, w: torch.Tensor, sorted_rows: torch.Tensor, expert_offsets: torch.Tensor
) -> torch.Tensor:
    """y [S, N] = per-slot expert GEMM; see the module docstring."""
    assert x.stride(-1) == 1 and w.stride(-1) == 1
    E, N, K = w.shape
    S = sorted_rows.shape[0]
    y = torch.empty((S, N), dtype=x.dtype, device=x.device)
    if S == 0:
        return y
    bm = 16 if S <= 16 * E else 64
    bn, bk = 64, 64
    counts = (expert_offsets[1:] - expert_offsets[:-1]).to(torch.int32)
    tiles_cum = torch.cumsum((counts + bm - 1) // bm, 0)
    grid = (triton.cdiv(S, bm) + E, triton.cdiv(N, bn))
    _moe_gemm_kernel[grid](
        x,
        w,
        y,
        sorted_rows,
        expert_offsets,
        tiles_cum.to(torch.int32),
        E,
        N,
        K,
        x.stride(0),
        w.stride(0),
        w.stride(1),
        y.stride(0),
        BM=bm,
        BN=bn,
        BK=bk,
        BLOCK_E=triton.next_power_of_2(E),
        F32_DOT=f32_dot(x.dtype),
        num_warps=4,
    )
    return y


def moe_gemm_reference(
    x: torch.Tensor, w: torch.Tensor, sorted_rows: torch.Tensor, expert_offsets: torch.Tensor
) -> torch.Tensor:
    """Torch reference of :func:`moe_gemm`: one dense matmul per expert, fp32."""
    y = torch.zeros((sorted_rows.shape[0], w.shape[1]), dtype=torch.float32, device=x.device)
    for e in range(w.shape[0]):
        a, b = int(expert_offsets[e]), int(expert_offsets[e + 1])
        if b > a:
            y[a:b] = x[sorted_rows[a:b].long()].float() @ w[e].float().T
    return y.to(x.dtype)

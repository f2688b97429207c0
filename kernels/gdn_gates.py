"""The per-token gates of Gated DeltaNet (Qwen3.5 / Qwen3-Next) in one launch.

Contract (H value heads):
    a, b      [T, H] projection outputs (any float dtype); views are fine: last dim contiguous,
              token stride free (e.g. columns of the fused in_proj output)
    A_log     [H], dt_bias [H]
    returns   (g [T, H] fp32, beta [T, H] fp32)
    g    = -exp(A_log) * softplus(a + dt_bias)      (the log-decay of kernels.gdn_recurrent)
    beta = sigmoid(b)
all in fp32, as ninfer.runtime.executors.cpu.ops.gdn_gates. softplus(x) is x above 20 (torch's
threshold) and log1p(exp(x)) below, with log1p computed by the u = 1 + e trick, exact to an ulp
also where e = exp(x) is far below fp32 epsilon. Grid (cdiv(T, BT),).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's default


@triton.jit
def _gates_kernel(
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    g_ptr,
    beta_ptr,
    T,
    H,
    stride_at,
    stride_bt,
    THRESHOLD: tl.constexpr,
    BT: tl.constexpr,
    BH: tl.constexpr,
):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    h = tl.arange(0, BH)
    hmask = h < H
    mask = (t < T)[:, None] & hmask[None, :]
    t64 = t.to(tl.int64)[:, None]
    a = tl.load(a_ptr + t64 * stride_at + h[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + t64 * stride_bt + h[None, :], mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(alog_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    dt_bias = tl.load(dtb_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    x = a + dt_bias[None, :]
    e = tl.exp(tl.minimum(x, THRESHOLD))  # [BT, BH]; capped: the branch above uses x itself
    u = 1.0 + e
    tiny = u == 1.0  # e below half an ulp of 1: log1p(e) = e
    log1p_e = tl.where(tiny, e, tl.log(u) * (e / tl.where(tiny, 1.0, u - 1.0)))
    softplus = tl.where(x > THRESHOLD, x, log1p_e)
    g = -tl.exp(a_log)[None, :] * softplus
    beta = tl.sigmoid(b)
    out = t64 * H + h[None, :]
    tl.store(g_ptr + out, g, mask=mask)
    tl.store(beta_ptr + out, beta, mask=mask)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta), both [T, H] fp32 and contiguous; see the module docstring."""
    T, H = a.shape
    assert b.shape == (T, H) and A_log.shape == (H,) and dt_bias.shape == (H,)
    assert a.stride(-1) == 1 and b.stride(-1) == 1
    assert A_log.stride(0) == 1 and dt_bias.stride(0) == 1
    g = torch.empty((T, H), dtype=torch.float32, device=a.device)
    beta = torch.empty((T, H), dtype=torch.float32, device=a.device)
    if T == 0:
        return g, beta
    bh = triton.next_power_of_2(H)
    bt = max(1, min(triton.next_power_of_2(T), 2048 // bh))
    _gates_kernel[(triton.cdiv(T, bt),)](
        a,
        b,
        A_log,
        dt_bias,
        g,
        beta,
        T,
        H,
        a.stride(0),
        b.stride(0),
        THRESHOLD=SOFTPLUS_THRESHOLD,
        BT=bt,
        BH=bh,
    )
    return g, beta


def gdn_gates_reference(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`gdn_gates` (the formula of ops_torch.gdn_gates)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())

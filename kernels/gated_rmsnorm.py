"""Per-head RMSNorm gated by SiLU(z): the output norm of Gated DeltaNet (Qwen3.5 / Qwen3-Next).

Contract (H heads of D values; x, z: [T, H*D]; w: [D]):

    r = x_h / sqrt(mean(x_h², -1) + eps)          per token and head, in fp32, rounded to x.dtype
    p = w * r                                     in torch's promoted dtype of (w, x): rounded to
                                                  x.dtype when w.dtype == x.dtype, else fp32
    y = p * silu(z_h)                             fp32, returned in x.dtype, [T, H*D] contiguous

— the rounding of ninfer.runtime.executors.cpu.ops.gated_rmsnorm and transformers' RMSNormGated, so
bf16 results agree to the last bit up to the rsqrt / exp rounding. x and z may be views (e.g.
z is columns of the fused in_proj output): last dim contiguous, token stride free, heads
packed. Grid (cdiv(T*H, BR),): each program normalises BR (token, head) rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _gated_rmsnorm_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    y_ptr,
    R,
    H,
    stride_xt,
    stride_zt,
    eps,
    D: tl.constexpr,
    BR: tl.constexpr,
    BD: tl.constexpr,
    ROUND_PROD: tl.constexpr,
):
    r = tl.program_id(0) * BR + tl.arange(0, BR)  # [BR] flat (token, head) rows
    d = tl.arange(0, BD)
    dmask = d < D
    mask = (r < R)[:, None] & dmask[None, :]
    t = (r // H).to(tl.int64)[:, None]
    col = (r % H)[:, None] * D + d[None, :]  # [BR, BD]
    x = tl.load(x_ptr + t * stride_xt + col, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * stride_zt + col, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # [BR]
    normed = (x * rstd[:, None]).to(y_ptr.dtype.element_ty).to(tl.float32)
    p = w[None, :] * normed
    if ROUND_PROD:
        p = p.to(y_ptr.dtype.element_ty).to(tl.float32)
    y = p * (z * tl.sigmoid(z))
    tl.store(
        y_ptr + r.to(tl.int64)[:, None] * D + d[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float, head_dim: int
) -> torch.Tensor:
    """y [T, H*D] in x.dtype, contiguous; see the module docstring."""
    T, HD = x.shape
    D = head_dim
    assert z.shape == (T, HD) and w.shape == (D,) and HD % D == 0
    assert x.stride(-1) == 1 and z.stride(-1) == 1 and w.stride(0) == 1
    H = HD // D
    y = torch.empty((T, HD), dtype=x.dtype, device=x.device)
    if T == 0:
        return y
    bd = triton.next_power_of_2(D)
    br = max(1, min(triton.next_power_of_2(T * H), 2048 // bd))
    _gated_rmsnorm_kernel[(triton.cdiv(T * H, br),)](
        x,
        z,
        w,
        y,
        T * H,
        H,
        x.stride(0),
        z.stride(0),
        eps,
        D=D,
        BR=br,
        BD=bd,
        ROUND_PROD=w.dtype == x.dtype and x.dtype != torch.float32,
    )
    return y


def gated_rmsnorm_reference(
    x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float, head_dim: int
) -> torch.Tensor:
    """Torch reference of :func:`gated_rmsnorm` (the code of ops_torch.gated_rmsnorm)."""
    xs = x.unflatten(-1, (-1, head_dim)).float()  # [T, H, D]
    r = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
    y = w * r.to(x.dtype)
    y = y * F.silu(z.unflatten(-1, (-1, head_dim)).float())
    return y.flatten(-2).to(x.dtype)

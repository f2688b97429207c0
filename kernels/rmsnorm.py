"""RMSNorm fused with the residual add.

Contract (x, residual: [T, H]; w: [H]):

    s = x + residual            (rounded to x.dtype: this is ``new_residual``)
    y = s / sqrt(mean(s², -1) + eps) * w          (zero_centered=False; Llama, Qwen3)
    y = s / sqrt(mean(s², -1) + eps) * (1 + w)    (zero_centered=True; Qwen3.5/Next)

The norm is computed in fp32 and ``y`` is returned in x.dtype. Without a residual, ``s`` is x
itself and ``new_residual`` is the very tensor ``x`` (no copy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import pdl_args, pdl_wait


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    res_out_ptr,
    H,
    stride_x,
    stride_r,
    stride_y,
    stride_ro,
    eps,
    HAS_RES: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait
    pdl_wait(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, s, mask=mask)
        x = s.to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    rstd = 1.0 / tl.sqrt(var + eps)
    if ZERO_CENTERED:
        w = w + 1.0
    y = x * rstd * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    zero_centered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton RMSNorm (+ residual add). x, residual: [T, H] (last dim contiguous); w: [H].

    Returns (y [T, H] in x.dtype, new_residual [T, H]); see the module docstring."""
    assert x.dim() == 2 and x.stride(-1) == 1, "x must be [T, H] with a contiguous last dim"
    T, H = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(-1) == 1
        res_out = torch.empty_like(y)
    else:
        res_out = x
    if T == 0:
        return y, res_out
    block = triton.next_power_of_2(H)
    _rmsnorm_kernel[(T,)](
        x,
        residual if residual is not None else x,
        w,
        y,
        res_out,
        H,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        y.stride(0),
        res_out.stride(0),
        eps,
        HAS_RES=residual is not None,
        ZERO_CENTERED=zero_centered,
        BLOCK=block,
        num_warps=4 if block <= 2048 else 8,
        **pdl_args(x.device),
    )
    return y, res_out


def rmsnorm_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    zero_centered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`rmsnorm` (same contract)."""
    s = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    sf = s.float()
    normed = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    wf = w.float() + 1.0 if zero_centered else w.float()
    return (normed * wf).to(x.dtype), s

"""Rotary position embedding, in place, rotate-half (HF "neox") layout, optionally partial and
optionally multimodal (interleaved 3-axis MRoPE of Qwen3-VL / Qwen3.5).

Contract: x is q or k, [T, heads, head_dim] (last dim contiguous; token and head strides free,
so views into a fused qkv buffer work). Only the first ``rotary_dim`` dims rotate; with
``half = rotary_dim // 2`` and frequency j in [0, half):

    angle_j = pos_j(t) * inv_freq[j]            (fp32, inv_freq = theta^(-2j/rotary_dim))
    x[j]        <- x[j] cos - x[j+half] sin
    x[j+half]   <- x[j+half] cos + x[j] sin

where cos and sin are multiplied by ``scale`` (1.0 by default; YaRN's attention factor) in fp32.

Plain rotary: positions [T] and pos_j(t) = positions[t]. MRoPE: positions [3, T] (temporal,
height, width) and frequency j reads axis 1 when j % 3 == 1 and j < 3*section[1], axis 2 when
j % 3 == 2 and j < 3*section[2], else axis 0 -- exactly transformers'
``Qwen3_5TextRotaryEmbedding.recomposition_frequencies``. Math in fp32; stored in x.dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


def rope_inv_freq(
    rotary_dim: int, theta: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """inv_freq [rotary_dim // 2] fp32, computed the way transformers does."""
    exps = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    return (1.0 / (theta**exps)).to(device)


@triton.jit
def cos_sin(ang):
    """(cos, sin) of fp32 angles [N] as [1, N] rows. The angles are first reduced to [-pi, pi]
    so that fast sin/cos stay accurate at large positions (Cody-Waite: 2*pi = 6.28125 + c2 + c3,
    the first with few mantissa bits so k*6.28125 is exact)."""
    k = tl.floor(ang * 0.15915494309189535 + 0.5)
    r = ang - k * 6.28125
    r = r - k * 0.0019353071693331003
    r = r - k * 1.0253131677018246e-11
    return tl.cos(r)[None, :], tl.sin(r)[None, :]


@triton.jit
def _rope_kernel(
    x_ptr,
    pos_ptr,
    inv_freq_ptr,
    n_heads,
    stride_t,
    stride_h,
    stride_pos_axis,
    scale,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    MROPE: tl.constexpr,
    S1: tl.constexpr,
    S2: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    j = tl.arange(0, BLOCK_HALF)
    jmask = j < HALF
    inv = tl.load(inv_freq_ptr + j, mask=jmask, other=0.0)
    p0 = tl.load(pos_ptr + t)
    if MROPE:
        p1 = tl.load(pos_ptr + stride_pos_axis + t)
        p2 = tl.load(pos_ptr + 2 * stride_pos_axis + t)
        pos = tl.where(
            (j % 3 == 1) & (j < 3 * S1), p1, tl.where((j % 3 == 2) & (j < 3 * S2), p2, p0)
        )
    else:
        pos = tl.zeros([BLOCK_HALF], dtype=tl.int64) + p0
    c, s = cos_sin(pos.to(tl.float32) * inv)  # [1, BLOCK_HALF] each
    c = c * scale
    s = s * scale
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (heads < n_heads)[:, None] & jmask[None, :]
    ptr = x_ptr + t * stride_t + heads[:, None].to(tl.int64) * stride_h + j[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    tl.store(ptr, o1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr + HALF, o2.to(x_ptr.dtype.element_ty), mask=mask)


def _check_mrope(mrope_section: Sequence[int] | None, half: int) -> tuple[int, int]:
    if mrope_section is None:
        return 0, 0
    assert len(mrope_section) == 3, "mrope_section has one entry per axis (t, h, w)"
    assert sum(mrope_section) == half, f"mrope_section {list(mrope_section)} must sum to {half}"
    return int(mrope_section[1]), int(mrope_section[2])


def rotary_(
    x: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    mrope_section: Sequence[int] | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] in place (see module docstring); returns x.

    positions: int [T] (plain) or [3, T] (MRoPE); inv_freq: fp32 [rotary_dim // 2]; scale
    multiplies cos and sin (a runtime argument: no recompilation per value)."""
    assert x.dim() == 3 and x.stride(-1) == 1, "x must be [T, heads, head_dim], last dim contiguous"
    T, n_heads, head_dim = x.shape
    half = inv_freq.numel()
    assert 2 * half <= head_dim
    s1, s2 = _check_mrope(mrope_section, half)
    if mrope_section is not None:
        assert positions.dim() == 2 and positions.shape == (3, T)
        stride_axis = positions.stride(0)
        assert positions.stride(1) == 1
    else:
        assert positions.dim() == 1 and positions.shape[0] == T and positions.stride(0) == 1
        stride_axis = 0
    if T == 0:
        return x
    block_h = min(16, triton.next_power_of_2(n_heads))
    grid = (T, triton.cdiv(n_heads, block_h))
    _rope_kernel[grid](
        x,
        positions,
        inv_freq.to(torch.float32).contiguous(),
        n_heads,
        x.stride(0),
        x.stride(1),
        stride_axis,
        float(scale),
        HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_H=block_h,
        MROPE=mrope_section is not None,
        S1=s1,
        S2=s2,
    )
    return x


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    *,
    rotary_dim: int | None = None,
    theta: float = 10000.0,
    inv_freq: torch.Tensor | None = None,
    mrope_section: Sequence[int] | None = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply rotary in place to q [T, Hq, D] and k [T, Hk, D]; returns (q, k).

    rotary_dim defaults to D; inv_freq (e.g. from a scaled-rope rule) overrides theta; scale
    multiplies cos and sin."""
    if inv_freq is None:
        inv_freq = rope_inv_freq(rotary_dim or q.shape[-1], theta, q.device)
    rotary_(q, positions, inv_freq, mrope_section, scale)
    rotary_(k, positions, inv_freq, mrope_section, scale)
    return q, k


def rotary_reference(
    x: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    mrope_section: Sequence[int] | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Torch reference of :func:`rotary_` (out of place): HF rotate-half math in fp32."""
    half = inv_freq.numel()
    rot = 2 * half
    if mrope_section is None:
        freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, half]
    else:
        s1, s2 = _check_mrope(mrope_section, half)
        freqs3 = positions.float()[:, :, None] * inv_freq.float()  # [3, T, half]
        j = torch.arange(half, device=x.device)
        axis = torch.zeros(half, dtype=torch.long, device=x.device)
        axis[(j % 3 == 1) & (j < 3 * s1)] = 1
        axis[(j % 3 == 2) & (j < 3 * s2)] = 2
        freqs = freqs3.gather(0, axis.expand(1, freqs3.shape[1], half)).squeeze(0)
    cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None, :] * scale  # [T, 1, rot]
    sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None, :] * scale
    xf = x.float()
    xr, xp = xf[..., :rot], xf[..., rot:]
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1).to(x.dtype)

from __future__ import annotations

import pytest
import torch

from kernels.gated_rmsnorm import gated_rmsnorm, gated_rmsnorm_reference
from ninfer.runtime.executors.cpu import ops as ops_torch

EPS = 1e-6


def _inputs(T: int, H: int, D: int, dtype: torch.dtype, w_dtype: torch.dtype, device: str):
    """x [T, H*D] contiguous; z a column view of a wider fused projection output."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(T, H * D, generator=gen).to(device, dtype)
    proj = (2 * torch.randn(T, H * D + 13, generator=gen)).to(device, dtype)
    z = proj[:, 5 : 5 + H * D]
    w = (1 + 0.3 * torch.randn(D, generator=gen)).to(device, w_dtype)
    return x, z, w


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
def test_reference_matches_transformers_and_runtime_op(w_dtype) -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    T, H, D = 4, 3, 16
    x, z, w = _inputs(T, H, D, torch.bfloat16, w_dtype, "cpu")
    y = gated_rmsnorm_reference(x, z, w, EPS, D)
    hf = Qwen3_5RMSNormGated(D, eps=EPS)
    hf.weight.data = w.clone()
    want = hf(x.unflatten(-1, (H, D)), z.unflatten(-1, (H, D))).flatten(-2)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, want)
    assert torch.equal(y, ops_torch.gated_rmsnorm(None, {"eps": EPS, "head_dim": D}, x, z, w))


@pytest.mark.parametrize(
    "dtype,w_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
@pytest.mark.parametrize("T,H,D", [(1, 4, 32), (19, 3, 24)])  # D = 24: a masked head
def test_kernel_matches_reference(device, dtype, w_dtype, T, H, D) -> None:
    x, z, w = _inputs(T, H, D, dtype, w_dtype, device)
    assert z.stride(0) == H * D + 13  # a strided view
    y = gated_rmsnorm(x, z, w, EPS, D)
    ref = gated_rmsnorm_reference(x, z, w, EPS, D)
    assert y.dtype == dtype and y.shape == (T, H * D) and y.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    else:
        # the interpreter truncates fp32 -> bf16 (three roundings: up to 3 ulps); on a GPU
        # (round to nearest even) the same roundings in the same order give equal values but
        # for rare last-bit rsqrt / exp differences
        torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
        if device == "cuda":
            assert (y == ref).float().mean() > 0.97

from __future__ import annotations

import pytest
import torch

from kernels.rmsnorm import rmsnorm, rmsnorm_reference

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def dense_rmsnorm(
    x: torch.Tensor, w: torch.Tensor, eps: float, zero_centered: bool
) -> torch.Tensor:
    # the obvious formula, float64
    x = x.double()
    wf = (1 + w.double()) if zero_centered else w.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * wf


def test_reference_matches_dense_formula() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, generator=g)
    w = torch.randn(24, generator=g)
    for zc in (False, True):
        y, r = rmsnorm_reference(x, w, 1e-6, zero_centered=zc)
        torch.testing.assert_close(y.double(), dense_rmsnorm(x, w, 1e-6, zc), rtol=1e-5, atol=1e-5)
        assert r is x


def test_reference_matches_transformers_qwen3_5_norm() -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    norm = Qwen3_5RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 32)
    y, _ = rmsnorm_reference(x, norm.weight.detach(), 1e-6, zero_centered=True)
    torch.testing.assert_close(y, norm(x).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_rmsnorm_matches_reference(device, dtype, with_residual, zero_centered) -> None:
    g = torch.Generator().manual_seed(1)
    T, H = 7, 48  # H not a power of two: exercises the mask
    x = torch.randn(T, H, generator=g).to(device, dtype)
    w = torch.randn(H, generator=g).to(device, dtype)
    res = torch.randn(T, H, generator=g).to(device, dtype) if with_residual else None
    y, r = rmsnorm(x, w, 1e-5, residual=res, zero_centered=zero_centered)
    y_ref, r_ref = rmsnorm_reference(x, w, 1e-5, residual=res, zero_centered=zero_centered)
    assert y.dtype == dtype and y.shape == (T, H)
    torch.testing.assert_close(y, y_ref, rtol=TOL[dtype], atol=TOL[dtype])
    # exact on GPU; the interpreter rounds fp32 -> bf16 by truncation (one ulp off)
    exact = device == "cuda" or dtype == torch.float32
    torch.testing.assert_close(r, r_ref, rtol=0 if exact else 8e-3, atol=0)
    if not with_residual:
        assert r is x


def test_rmsnorm_strided_rows(device) -> None:
    x = torch.randn(4, 64, device=device)[:, :40]  # row stride 64, width 40
    w = torch.rand(40, device=device)
    y, _ = rmsnorm(x, w, 1e-6)
    torch.testing.assert_close(y, rmsnorm_reference(x, w, 1e-6)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_rmsnorm_large(device) -> None:
    x = torch.randn(4096, 5120, device=device, dtype=torch.bfloat16)
    res = torch.randn_like(x)
    w = torch.randn(5120, device=device, dtype=torch.bfloat16)
    y, r = rmsnorm(x, w, 1e-6, residual=res, zero_centered=True)
    y_ref, r_ref = rmsnorm_reference(x, w, 1e-6, residual=res, zero_centered=True)
    torch.testing.assert_close(y, y_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(r, r_ref)

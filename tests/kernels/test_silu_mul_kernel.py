from __future__ import annotations

import pytest
import torch

from kernels.silu_mul import silu_mul, silu_mul_reference


def test_reference_is_swiglu() -> None:
    gu = torch.randn(3, 10)
    g, u = gu[:, :5], gu[:, 5:]
    torch.testing.assert_close(silu_mul_reference(gu), g / (1 + torch.exp(-g)) * u)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_reference(device, dtype) -> None:
    gu = torch.randn(6, 2 * 40, device=device, dtype=dtype)
    out = silu_mul(gu)
    assert out.shape == (6, 40) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, silu_mul_reference(gu), rtol=tol, atol=tol)


@pytest.mark.gpu
def test_silu_mul_large(device) -> None:
    gu = torch.randn(2048, 2 * 17408, device=device, dtype=torch.bfloat16)
    torch.testing.assert_close(silu_mul(gu), silu_mul_reference(gu), rtol=1e-2, atol=1e-2)

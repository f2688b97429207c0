from __future__ import annotations

import pytest
import torch

from kernels.gdn_gates import gdn_gates, gdn_gates_reference
from ninfer.runtime.executors.cpu import ops as ops_torch


def _inputs(T: int, H: int, dtype: torch.dtype, device: str, pad: int = 9):
    """a, b as column views of one fused projection output [T, pad + 2H] (token stride > 2H)."""
    gen = torch.Generator().manual_seed(1)
    proj = (3 * torch.randn(T, pad + 2 * H, generator=gen)).to(device, dtype)
    b, a = proj[:, pad : pad + H], proj[:, pad + H :]
    A_log = torch.randn(H, generator=gen).to(device, dtype)
    dt_bias = torch.randn(H, generator=gen).to(device, dtype)
    return a, b, A_log, dt_bias


def test_reference_is_the_runtime_op() -> None:
    a, b, A_log, dt_bias = _inputs(5, 6, torch.bfloat16, "cpu")
    g, beta = gdn_gates_reference(a, b, A_log, dt_bias)
    g_op, beta_op = ops_torch.gdn_gates(None, {}, a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32
    assert torch.equal(g, g_op) and torch.equal(beta, beta_op)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 37])
def test_kernel_matches_reference_on_views(device, dtype, T) -> None:
    H = 12  # not a power of two
    a, b, A_log, dt_bias = _inputs(T, H, dtype, device)
    assert a.stride(0) == 9 + 2 * H  # a strided view
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gates_reference(a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32 and g.is_contiguous()
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta, beta_ref, rtol=1e-5, atol=1e-6)


def test_softplus_branches_are_accurate(device) -> None:
    # a + dt_bias from deep in the log1p(e^x) ~ e^x tail, across 0, to both sides of the
    # threshold 20 and far above it (where e^x overflows)
    x = torch.tensor([-60.0, -30.0, -17.0, -3.0, -1e-3, 0.0, 0.7, 19.9, 20.0, 20.1, 90.0, 300.0])
    H = x.numel()
    a = x[None].to(device)
    b = torch.linspace(-30, 30, H)[None].to(device)
    zeros = torch.zeros(H, device=device)  # A_log = 0: g = -softplus(a)
    g, beta = gdn_gates(a, b, zeros, zeros)
    g_ref, beta_ref = gdn_gates_reference(a, b, zeros, zeros)
    # relative accuracy also where softplus is ~1e-26 (a plain log(1 + e^x) would give 0)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=0.0)
    torch.testing.assert_close(beta, beta_ref, rtol=1e-5, atol=0.0)
    assert torch.isfinite(g).all()

"""kernels.skinny_pdl: the 16-row tiles with programmatic dependent launch give
kernels.gemv.dense_skinny's result, and with a SwiGLU input silu_mul's then dense_skinny's."""

from __future__ import annotations

import pytest
import torch

from kernels.gemv import SkinnyConfig, dense_skinny
from kernels.silu_mul import silu_mul
from kernels.skinny_pdl import skinny_pdl


@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("M", [5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_pdl_is_dense_skinny(glu, M, dtype):
    g = torch.Generator().manual_seed(M)
    N, K = 40, 96  # neither a multiple of the tiles: masked edges
    x = torch.randn(M, 2 * K if glu else K, generator=g).to(dtype)
    w = (0.1 * torch.randn(N, K, generator=g)).to(dtype)
    cfg = SkinnyConfig(32, 64, 2)
    got = skinny_pdl(x, w, cfg, glu=glu)
    want = dense_skinny(silu_mul(x) if glu else x, w, cfg)
    assert got.shape == (M, N) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    ref = (silu_mul(x) if glu else x).float() @ w.float().T
    torch.testing.assert_close(got.float(), ref, atol=5 * tol, rtol=5 * tol)

from __future__ import annotations

import pytest
import torch

from kernels.gemv import (
    DenseGemvConfig,
    SkinnyConfig,
    dense_gemv,
    dense_gemv_reference,
    dense_skinny,
    load_table,
)


def _tol(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


@pytest.mark.parametrize("M", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize(
    "cfg,N,K",
    [
        (DenseGemvConfig(4, 1, 1), 24, 512),  # even: K a multiple of the chunk, N of BN
        (DenseGemvConfig(4, 1, 2), 24, 512),
        (DenseGemvConfig(2, 1, 4), 10, 1024),
        (DenseGemvConfig(4, 1, 4), 13, 700),  # ragged N and K: masked loads
        (DenseGemvConfig(8, 2, 2), 5, 300),
    ],
)
def test_dense_gemv_matches_reference(device, M, glu, cfg, N, K) -> None:
    g = torch.Generator().manual_seed(M * 100 + N + K)
    x = torch.randn(M, 2 * K if glu else K, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(N, K, generator=g) * 0.05).to(device, torch.bfloat16)
    y = dense_gemv(x, w, cfg, glu=glu)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    torch.testing.assert_close(
        y.float(), dense_gemv_reference(x, w, glu=glu).float(), **_tol(x.dtype)
    )


def test_dense_gemv_fp32_and_strided_rows(device) -> None:
    """fp32 weights; x rows with a stride larger than K (a view of a wider buffer)."""
    K, N = 256, 12
    big = torch.randn(3, K + 64, device=device)
    x = big[:, :K]
    w = torch.randn(N, K, device=device)
    y = dense_gemv(x, w, DenseGemvConfig(4, 1, 1))
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-4, atol=1e-4)


def test_reference_glu_is_swiglu() -> None:
    x = torch.randn(2, 16)
    w = torch.randn(5, 8)
    g, u = x[:, :8], x[:, 8:]
    torch.testing.assert_close(
        dense_gemv_reference(x, w, glu=True), (torch.nn.functional.silu(g) * u) @ w.t()
    )


def test_table_round_trip(tmp_path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"4096:12288:1": {"1": [4, 4, 2], "2": [8, 4, 1]}, "6144:4096:0": {}}')
    t = load_table(p)
    assert t[(4096, 12288, True, 1)] == DenseGemvConfig(4, 4, 2)
    assert t[(4096, 12288, True, 2)].bk == 8 * 32 * 4
    assert (6144, 4096, False, 1) not in t
    assert load_table(tmp_path / "missing.json") == {}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "N,K,glu", [(6144, 4096, False), (4096, 12288, True), (151936, 4096, False)]
)
def test_dense_gemv_model_shapes(device, N, K, glu) -> None:
    x = torch.randn(1, 2 * K if glu else K, device=device, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * 0.05
    for cfg in (DenseGemvConfig(4, 4, 2), DenseGemvConfig(8, 8, 1), DenseGemvConfig(2, 4, 4)):
        y = dense_gemv(x, w, cfg, glu=glu)
        torch.testing.assert_close(
            y.float(), dense_gemv_reference(x, w, glu=glu).float(), rtol=2e-2, atol=2e-2
        )


@pytest.mark.parametrize("M", [5, 8, 16])
@pytest.mark.parametrize(
    "cfg,N,K", [(SkinnyConfig(16, 64, 2), 48, 256), (SkinnyConfig(32, 128, 3), 40, 200)]
)
def test_skinny_matches_reference(device, M, cfg, N, K) -> None:
    g = torch.Generator().manual_seed(M + N)
    x = torch.randn(M, K, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(N, K, generator=g) * 0.05).to(device, torch.bfloat16)
    y = dense_skinny(x, w, cfg)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), dense_gemv_reference(x, w).float(), rtol=2e-2, atol=2e-2)

"""kernels/fp8_skinny.py: 5..16 rows of x against fp8 rows (e4m3 bytes, a scale per row) on
tensor-core tiles, against the dequantised reference; ragged N and K, float8 bytes as well as
uint8, and the launch table's choice (measured, nearest measured width, default, quant_linear
where it won)."""

from __future__ import annotations

import json

import pytest
import torch

from kernels import fp8_skinny as mod
from kernels.fp8_skinny import DEFAULT, Fp8SkinnyConfig, fp8_skinny, fp8_skinny_reference
from kernels.quant_gemm import quantize_weight_fp8


def _weight(N: int, K: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 bytes [N, K] and scales [N]; rows of different magnitudes, some e4m3 subnormals."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * torch.logspace(-2, 1, N)[:, None]
    w[:, ::7] *= 1e-4
    q, s = quantize_weight_fp8(w)
    return q.to(device), s.to(device)


@pytest.mark.parametrize("M", [5, 9, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "cfg,N,K",
    [
        (Fp8SkinnyConfig(16, 64, 2), 48, 256),  # even: N a multiple of BN, K of BK
        (Fp8SkinnyConfig(32, 128, 3), 70, 200),  # ragged N and K: masked loads
        (DEFAULT, 33, 520),
    ],
)
def test_fp8_tiles_match_the_dequantised_product(device, M, dtype, cfg, N, K) -> None:
    q, s = _weight(N, K, device, seed=N + K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(device, dtype)
    got = fp8_skinny(x, q, s, cfg).float()
    want = fp8_skinny_reference(x, q, s).float()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.shape == (M, N) and got.dtype == torch.float32
    assert float((got - want).abs().max() / want.abs().max()) < tol
    as_float8 = fp8_skinny(x, q.view(torch.float8_e4m3fn), s, cfg).float()
    assert torch.equal(as_float8, got)


def test_the_table_names_the_launch(tmp_path, monkeypatch) -> None:
    path = tmp_path / "fp8_skinny_table.json"
    path.write_text(json.dumps({"4096:4096": {"16": [32, 256, 4, 4]}, "6144:4096": {}}))
    monkeypatch.setattr(mod, "TABLE_PATH", path)
    mod.load_table.cache_clear()
    try:
        assert mod.fp8_skinny_config(4096, 4096, 16) == Fp8SkinnyConfig(32, 256, 4, 4)
        assert mod.fp8_skinny_config(4096, 4096, 8) is None  # measured: quant_linear won
        assert mod.fp8_skinny_config(6144, 4096, 16) is None
        assert mod.fp8_skinny_config(3000, 4096, 12) == Fp8SkinnyConfig(32, 256, 4, 4)  # nearest
        assert mod.fp8_skinny_config(4096, 300, 16) == DEFAULT  # a depth never measured
    finally:
        mod.load_table.cache_clear()

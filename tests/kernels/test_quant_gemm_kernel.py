from __future__ import annotations

import pytest
import torch

from kernels.quant_decode import E2M1_VALUES
from kernels.quant_gemm import (
    dequantize_weight,
    quant_linear,
    quant_linear_reference,
    quantize_weight_fp8,
    quantize_weight_nvfp4,
)
from kernels.quant_gemv import GemvConfig


def test_nvfp4_dequant_by_hand() -> None:
    # one row, K = 32: nibbles 0..15 then 15..0; block scales 1.0 and 2.0 (e4m3 0x38, 0x40)
    nibbles = list(range(16)) + list(range(15, -1, -1))
    packed = torch.tensor(
        [[nibbles[2 * i] | (nibbles[2 * i + 1] << 4) for i in range(16)]], dtype=torch.uint8
    )
    scale = torch.tensor([[0x38, 0x40]], dtype=torch.uint8)
    vals = list(E2M1_VALUES) + [-v for v in E2M1_VALUES]
    expect = torch.tensor(
        [[vals[n] * (1.0 if i < 16 else 2.0) * 0.5 for i, n in enumerate(nibbles)]]
    )
    torch.testing.assert_close(dequantize_weight(packed, scale, "nvfp4", 0.5), expect)


def test_fp8_dequant_by_hand() -> None:
    w = torch.tensor([[0x38, 0xB8, 0x7E, 0x01]], dtype=torch.uint8)  # 1, -1, 448, 2^-9
    got = dequantize_weight(w, torch.tensor([2.0]), "fp8")
    torch.testing.assert_close(got, torch.tensor([[2.0, -2.0, 896.0, 2.0**-8]]))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quantisers_approximate_the_weight(fmt) -> None:
    w = torch.randn(24, 64)
    if fmt == "fp8":
        q, s = quantize_weight_fp8(w)
        back = dequantize_weight(q, s, fmt)
    else:
        q, s, g = quantize_weight_nvfp4(w)
        back = dequantize_weight(q, s, fmt, g)
    rel = (back - w).norm() / w.norm()
    assert rel < (0.05 if fmt == "fp8" else 0.15)


def _make(fmt, N, K, device):
    w = torch.randn(N, K)
    if fmt == "fp8":
        q, s = quantize_weight_fp8(w)
        return q.to(device), s.to(device), 1.0
    q, s, g = quantize_weight_nvfp4(w)
    return q.to(device), s.to(device), g


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("M", [1, 5, 19])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_linear_matches_reference(device, fmt, M, dtype) -> None:
    N, K = 40, 96  # N, K not multiples of the tiles
    q, s, g = _make(fmt, N, K, device)
    x = torch.randn(M, K, device=device, dtype=dtype)
    y = quant_linear(x, q, s, fmt, g)
    ref = quant_linear_reference(x, q, s, fmt, g)
    assert y.shape == (M, N) and y.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quant_linear_split_k(device, fmt) -> None:
    q, s, g = _make(fmt, 32, 128, device)
    x = torch.randn(3, 128, device=device)
    torch.testing.assert_close(
        quant_linear(x, q, s, fmt, g, split_k=3),
        quant_linear_reference(x, q, s, fmt, g),
        rtol=1e-4,
        atol=1e-3,
    )


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 6])
@pytest.mark.parametrize(
    "cfg", [GemvConfig(4, 1), GemvConfig(16, 1, prefetch=True)], ids=["bn4", "bn16-prefetch"]
)
def test_gemv_path_matches_reference(device, fmt, M, cfg) -> None:
    # N, K ragged against the tiles (masked path); M = 3, 6: rows of x past M are masked
    N, K = 37, 400
    q, s, g = _make(fmt, N, K, device)
    x = torch.randn(M, K, device=device)
    y = quant_linear(x, q, s, fmt, g, path="gemv", config=cfg)
    torch.testing.assert_close(y, quant_linear_reference(x, q, s, fmt, g), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("M", [1, 2])
def test_gemv_even_tiles(device, fmt, M) -> None:
    # N a multiple of the rows per program, K of the chunk (8 * 32 * warps): unmasked loads
    cfg = GemvConfig(8, 1)
    N, K = 16, 2 * cfg.bk
    q, s, g = _make(fmt, N, K, device)
    x = torch.randn(M, K, device=device)
    y = quant_linear(x, q, s, fmt, g, path="gemv", config=cfg)
    torch.testing.assert_close(y, quant_linear_reference(x, q, s, fmt, g), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("path", ["gemv", "tiled", "dense"])
def test_nvfp4_per_row_global_scale(device, path) -> None:
    # a fused projection whose two sources carry different global scales is one GEMM
    qa, sa, ga = _make("nvfp4", 24, 64, device)
    qb, sb, gb = _make("nvfp4", 16, 64, device)
    gb = gb * 3.0
    q, s = torch.cat([qa, qb]), torch.cat([sa, sb])
    rows = torch.tensor([ga] * 24 + [gb] * 16, dtype=torch.float32, device=device)
    x = torch.randn(3, 64, device=device)
    y = quant_linear(x, q, s, "nvfp4", rows, path=path)
    want = torch.cat(
        [
            quant_linear_reference(x, qa, sa, "nvfp4", ga),
            quant_linear_reference(x, qb, sb, "nvfp4", gb),
        ],
        dim=1,
    )
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(quant_linear_reference(x, q, s, "nvfp4", rows), want)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dense_path_matches_reference(device, fmt) -> None:
    q, s, g = _make(fmt, 40, 96, device)
    x = torch.randn(7, 96, device=device)
    y = quant_linear(x, q, s, fmt, g, path="dense")
    torch.testing.assert_close(y, quant_linear_reference(x, q, s, fmt, g), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("M", [1, 3, 8, 40, 300])
@pytest.mark.parametrize("NK", [(6144, 4096), (4096, 12288)])
def test_quant_linear_real_shapes_gpu(device, fmt, M, NK) -> None:
    # Qwen3-8B qkv and down projections through the default path for M, bf16 activations
    N, K = NK
    q, s, g = _make(fmt, N, K, device)
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    y = quant_linear(x, q, s, fmt, g)
    ref = quant_linear_reference(x, q, s, fmt, g).float()
    err = (y.float() - ref).abs().max() / ref.abs().max()
    assert err < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_gemv_sweep_configs_gpu(device, fmt) -> None:
    # every launch shape the benchmark sweeps computes the same function
    N, K = 4096, 4096
    q, s, g = _make(fmt, N, K, device)
    x = torch.randn(2, K, device=device, dtype=torch.bfloat16)
    ref = quant_linear_reference(x, q, s, fmt, g).float()
    for bn in (4, 8, 16):
        for warps in (4, 8):
            for prefetch in (False, True):
                cfg = GemvConfig(bn, warps, prefetch)
                for m in (1, 2):
                    y = quant_linear(x[:m], q, s, fmt, g, path="gemv", config=cfg).float()
                    err = (y - ref[:m]).abs().max() / ref[:m].abs().max()
                    assert err < 1e-2, (cfg, m, float(err))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("M", [1, 8, 64, 1000])
def test_quant_linear_large_gpu(device, fmt, M) -> None:
    q, s, g = _make(fmt, 4096, 2048, device)
    x = torch.randn(M, 2048, device=device, dtype=torch.bfloat16)
    y = quant_linear(x, q, s, fmt, g)
    ref = quant_linear_reference(x, q, s, fmt, g)
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=0.5)

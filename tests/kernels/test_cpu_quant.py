"""kernels/cpu_quant.py: the packed CPU GEMM of each GGUF block format against the float32
product with the reference dequantiser's weights, and its row lookup against the reference
rows (exact).

The bound is the module's: bf16 x, bf16 scale/zero and a bf16 result, each a relative 2^-9,
so |y - x W^T| <= 3 * 2^-9 * (|x| |W|^T) elementwise (fp32 sums add far less).
"""

from __future__ import annotations

from typing import Any

import gguf.quants
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from kernels.cpu_quant import gguf_rows, half_logits, int4pack_linear, pack_gguf
from ninfer.artifact.format import StoredTensor
from ninfer.artifact.quant import dequantize

FORMATS = ("Q4_0", "Q4_1", "Q8_0")
BOUND = 3 * 2.0**-9


def _raw(qtype: str, n: int, k: int, rng: np.random.Generator, offset: float) -> np.ndarray:
    """GGUF blocks of a random [n, k] weight (per-row offsets make Q4_1's m matter)."""
    w = rng.standard_normal((n, k)) * 0.05 + rng.standard_normal((n, 1)) * offset
    return gguf.quants.quantize(w.astype(np.float32), T[qtype])


def _packed(
    qtype: str, n: int, k: int, seed: int, offset: float, **layout: bool
) -> tuple[np.random.Generator, np.ndarray, Any]:
    """(the generator, raw GGUF blocks [n, k], their packing with `layout`): random blocks of
    `qtype` from a generator seeded with `seed`, which the caller keeps drawing from."""
    rng = np.random.default_rng(seed)
    raw = _raw(qtype, n, k, rng, offset=offset)
    return rng, raw, pack_gguf(f"gguf:{qtype}", [raw], k, **layout)


def _dense(qtype: str, raw: np.ndarray, n: int, k: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(StoredTensor(f"gguf:{qtype}", (n, k), {"data": raw})))


def _within_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    err = (y.double() - ref).abs()
    assert (err <= BOUND * scale + 1e-30).all(), (err / scale).max().item() / 2.0**-9


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize(("n", "k", "t"), [(16, 32, 1), (40, 64, 3), (17, 96, 5), (960, 576, 1)])
def test_packed_gemm_matches_dequantised_weights(qtype, n, k, t):
    rng, raw, w = _packed(qtype, n, k, n * k + t, 0.03)
    x = torch.from_numpy(rng.standard_normal((t, k)).astype(np.float32))
    y = int4pack_linear(x, w)
    assert y.shape == (t, n) and y.dtype == torch.float32
    _within_bound(y, x, _dense(qtype, raw, n, k))


@pytest.mark.parametrize("qtype", FORMATS)
def test_fused_sources_concatenate_along_n(qtype):
    """A fused GEMM (q|k|v) is its sources' rows one after the other."""
    rng = np.random.default_rng(7)
    k, ns = 64, (48, 16, 8)
    raws = [_raw(qtype, n, k, rng, offset=0.1) for n in ns]
    w = pack_gguf(f"gguf:{qtype}", raws, k)
    dense = torch.cat([_dense(qtype, r, n, k) for r, n in zip(raws, ns)])
    x = torch.from_numpy(rng.standard_normal((2, k)).astype(np.float32))
    _within_bound(int4pack_linear(x, w), x, dense)


@pytest.mark.parametrize("qtype", FORMATS)
def test_arbitrary_block_bytes(qtype):
    """Every code of every block, not only what the quantiser emits: random bytes with finite
    f16 scales (Q8_0: the full int8 range -128..127, Q4_1: negative and positive m)."""
    rng = np.random.default_rng(11)
    n, k = 32, 128
    raw = rng.integers(0, 256, size=(n, k // 32 * {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[qtype]))
    raw = raw.astype(np.uint8).reshape(n, k // 32, -1)
    raw[..., 0:2] = np.float16(rng.uniform(-0.02, 0.02, (n, k // 32, 1))).view(np.uint8)
    if qtype == "Q4_1":
        raw[..., 2:4] = np.float16(rng.uniform(-0.3, 0.3, (n, k // 32, 1))).view(np.uint8)
    raw = raw.reshape(n, -1)
    w = pack_gguf(f"gguf:{qtype}", [raw], k, rows=True)
    x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32))
    _within_bound(int4pack_linear(x, w), x, _dense(qtype, raw, n, k))


@pytest.mark.parametrize("qtype", FORMATS)
def test_rows_equal_the_dequantised_table(qtype):
    n, k = 50, 64
    _, raw, w = _packed(qtype, n, k, 3, 0.2, gemm=False, rows=True)
    ids = torch.tensor([0, 49, 7, 7], dtype=torch.int32)
    got = gguf_rows(ids, w, torch.float32)
    assert torch.equal(got, _dense(qtype, raw, n, k)[ids.long()])


def test_bad_input_is_named():
    raw = np.zeros((16, 18), np.uint8)
    with pytest.raises(ValueError, match="Q4_K"):
        pack_gguf("gguf:Q4_K", [raw], 32)
    with pytest.raises(ValueError, match="do not hold K = 64"):
        pack_gguf("gguf:Q4_0", [raw], 64)
    rows_only = pack_gguf("gguf:Q4_0", [raw], 32, gemm=False, rows=True)
    with pytest.raises(ValueError, match="without its GEMM layout"):
        int4pack_linear(torch.zeros(1, 32), rows_only)


@pytest.mark.parametrize("qtype", FORMATS)
def test_half_logits_within_the_f16_bound(qtype):
    """The lm_head path: |y - x W^T| <= 3 * 2^-11 * (|x| |W|^T), float32 out."""
    n, k = 300, 64
    rng, raw, w = _packed(qtype, n, k, 5, 0.1, gemm=False, half=True)
    x = torch.from_numpy(rng.standard_normal((2, k)).astype(np.float32))
    y = half_logits(x, w)
    dense = _dense(qtype, raw, n, k).double()
    ref, scale = x.double() @ dense.T, x.double().abs() @ dense.abs().T
    assert y.dtype == torch.float32
    assert ((y.double() - ref).abs() <= 3 * 2.0**-11 * scale).all()


def test_half_logits_survive_an_x_beyond_f16_range():
    _, raw, w = _packed("Q8_0", 16, 32, 6, 0.0, gemm=False, half=True)
    x = torch.full((1, 32), 1.0e5)
    ref = x.double() @ _dense("Q8_0", raw, 16, 32).double().T
    y = half_logits(x, w)
    assert torch.isfinite(y).all()
    assert torch.allclose(y.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def test_block_sizes_are_ggufs():
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from kernels.cpu_quant import BLOCK_BYTES

    for fmt, size in BLOCK_BYTES.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType[fmt.removeprefix("gguf:")]] == (32, size)

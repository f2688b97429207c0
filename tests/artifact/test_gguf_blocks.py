"""Our GGML block dequantisers against the `gguf` package's reference, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from ninfer.artifact.gguf_blocks import BLOCK_SIZES, BLOCK_TYPES, dequantize_blocks, row_bytes
from ninfer.errors import ConvertError


def _random_blocks(type_name: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    """Random bytes, with every f16 scale field replaced by a finite value (random bytes alone
    make NaN / inf scales often enough to hide the rest of the block)."""
    rng = np.random.default_rng(seed)
    _, size = BLOCK_SIZES[type_name]
    data = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    scales = rng.normal(0, 0.05, (rows, blocks, 2)).astype(np.float16).view(np.uint8)
    if type_name == "Q6_K":  # d is the last two bytes
        data[..., 208:210] = scales[..., :2]
    else:  # d (and dmin / m) lead the block
        data[..., 0:2] = scales[..., :2]
        if type_name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
            data[..., 2:4] = (
                rng.normal(0, 0.05, (rows, blocks, 1)).astype(np.float16).view(np.uint8)
            )
    return data.reshape(rows, blocks * size)


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_blocks_equal_gguf_reference(type_name: str, seed: int) -> None:
    elems, _ = BLOCK_SIZES[type_name]
    rows, blocks = 7, 5
    data = _random_blocks(type_name, rows, blocks, seed)
    ours = dequantize_blocks(data, type_name, (rows, blocks * elems))
    ref = gguf_dequantize(data, GGMLQuantizationType[type_name])
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_fully_random_bytes_equal_gguf_reference(type_name: str) -> None:
    """Any bit pattern, NaN and inf scales included, decodes as the reference decodes it."""
    elems, size = BLOCK_SIZES[type_name]
    data = np.random.default_rng(7).integers(0, 256, (3, 4 * size), dtype=np.uint8)
    ours = dequantize_blocks(data, type_name, (3, 4 * elems))
    ref = gguf_dequantize(data, GGMLQuantizationType[type_name]).astype(np.float32)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantised_weights_round_trip_close(type_name: str) -> None:
    """Blocks the reference quantiser wrote from real-looking weights decode near the weights
    (so the layout, not only the arithmetic, is right: a swapped nibble order would be far off)."""
    w = np.random.default_rng(3).normal(0, 0.02, (4, 64)).astype(np.float32)
    data = gguf_quantize(w, GGMLQuantizationType[type_name])
    ours = dequantize_blocks(data, type_name, w.shape)
    assert np.abs(ours - w).max() < 0.25 * np.abs(w).max()


def test_wrong_byte_count_is_refused() -> None:
    with pytest.raises(ConvertError, match="do not hold a tensor of shape"):
        dequantize_blocks(np.zeros(143, np.uint8), "Q4_K", (1, 256))
    with pytest.raises(ConvertError, match="unsupported GGML block type IQ2_XS"):
        dequantize_blocks(np.zeros(10, np.uint8), "IQ2_XS", (1, 256))
    assert row_bytes("Q6_K", 512) == 420
    with pytest.raises(ConvertError, match="multiple of 256"):
        row_bytes("Q5_K", 100)

"""kernels.block_attention (the DFlash drafter's block attention) against its torch reference
and against SDPA over the same keys, for every split count, GQA and plain heads, rows of
different context lengths (none at all included)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.block_attention import block_attention, block_attention_reference, block_splits


def _inputs(B, n, H, Hkv, D, S, dtype, device, seed=0):
    """q, k, v on `device` (the GPU when there is one, else the CPU: interpreted kernels)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B * n, H, D, generator=g).to(device, dtype)
    k = torch.randn(B + 1, S, Hkv, D, generator=g).to(
        device, dtype
    )  # a spare row: P > B is allowed
    v = torch.randn(B + 1, S, Hkv, D, generator=g).to(device, dtype)
    return q, k, v


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize(
    ("n", "H", "Hkv", "D", "dtype"),
    [(16, 8, 2, 32, torch.float32), (8, 4, 4, 24, torch.float32), (4, 4, 1, 16, torch.bfloat16)],
)
def test_block_attention_matches_the_reference(splits, n, H, Hkv, D, dtype, device):
    B, S = 3, n + 150
    q, k, v = _inputs(B, n, H, Hkv, D, S, dtype, device)
    lengths = torch.tensor([150, 0, 77], dtype=torch.int32, device=device)
    scale = D**-0.5
    got = block_attention(q, k, v, lengths, n, scale=scale, splits=splits)
    want = block_attention_reference(q, k, v, lengths, n, scale=scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_block_attention_is_sdpa_over_the_rows_keys(device):
    """Row by row, the same numbers as SDPA (GQA) over the row's valid keys: stale values past a
    row's length are never read."""
    B, n, H, Hkv, D, S = 2, 8, 4, 2, 16, 8 + 100
    q, k, v = _inputs(B, n, H, Hkv, D, S, torch.float32, device, seed=3)
    k[1, n + 40 :] = float("nan")  # past row 1's length: must not reach the output
    v[1, n + 40 :] = float("nan")
    lengths = torch.tensor([100, 40], dtype=torch.int32, device=device)
    got = block_attention(q, k, v, lengths, n, scale=0.3, splits=block_splits(S))
    for b, c in enumerate(lengths.tolist()):
        qb = q[b * n : (b + 1) * n].transpose(0, 1)  # [H, n, D]
        kb = k[b, : n + c].transpose(0, 1)
        vb = v[b, : n + c].transpose(0, 1)
        want = F.scaled_dot_product_attention(qb, kb, vb, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(
            got[b * n : (b + 1) * n], want.transpose(0, 1), atol=1e-5, rtol=1e-5
        )


def test_block_splits():
    assert [block_splits(L) for L in (16, 128, 129, 528, 4096, 1 << 20)] == [1, 1, 2, 8, 16, 16]
    # about 128 programs in all: rows x KV heads x ranges
    assert [block_splits(4096, g) for g in (8, 16, 24, 32, 64, 128, 256)] == [16, 8, 4, 4, 2, 1, 1]
    assert block_splits(528, 32) == 4 and block_splits(200, 32) == 2

from __future__ import annotations

import pytest
import torch

from kernels.moe_gemm import moe_gemm, moe_gemm_reference, moe_sort


def test_sort_and_reference_match_per_assignment_matmul() -> None:
    gen = torch.Generator().manual_seed(0)
    T, E, k, N, K = 6, 4, 2, 8, 12
    x = torch.randn(T, K, generator=gen)
    w = torch.randn(E, N, K, generator=gen)
    topk = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    srt = moe_sort(topk, E)
    assert srt.expert_offsets.tolist()[-1] == T * k
    y = moe_gemm_reference(x, w, srt.sorted_rows, srt.expert_offsets)
    for t in range(T):
        for j in range(k):
            torch.testing.assert_close(y[srt.slot_of[t, j]], x[t] @ w[topk[t, j]].T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 11])
def test_moe_gemm_matches_reference(device, dtype, T) -> None:
    gen = torch.Generator().manual_seed(1)
    E, k, N, K = 5, 2, 24, 40  # expert 4 never chosen below when T == 1
    x = torch.randn(T, K, generator=gen).to(device, dtype)
    w = torch.randn(E, N, K, generator=gen).to(device, dtype)
    topk = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(device)
    srt = moe_sort(topk, E)
    y = moe_gemm(x, w, srt.sorted_rows, srt.expert_offsets)
    ref = moe_gemm_reference(x, w, srt.sorted_rows, srt.expert_offsets)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol * 5)


def test_moe_gemm_expert_with_many_tiles(device) -> None:
    # 40 slots on one expert span three 16-row tiles; the others are empty
    x = torch.randn(40, 16, device=device)
    w = torch.randn(3, 16, 16, device=device)
    srt = moe_sort(torch.full((40, 1), 1, device=device), 3)
    y = moe_gemm(x, w, srt.sorted_rows, srt.expert_offsets)
    torch.testing.assert_close(y, x @ w[1].T, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_moe_gemm_large_gpu(device) -> None:
    T, E, k, N, K = 2048, 64, 8, 1536, 2048
    x = torch.randn(T, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device=device, dtype=torch.bfloat16) / 30
    topk = torch.randint(0, E, (T, k), device=device)
    srt = moe_sort(topk, E)
    y = moe_gemm(x, w, srt.sorted_rows, srt.expert_offsets)
    ref = moe_gemm_reference(x, w, srt.sorted_rows, srt.expert_offsets)
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=5e-2)

from __future__ import annotations

import pytest
import torch

from kernels.gdn_conv import causal_conv1d, causal_conv1d_reference
from kernels.gdn_recurrent import gated_delta_rule_recurrent, gated_delta_rule_reference


def test_conv_reference_matches_transformers() -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn

    C, L = 6, 9
    x = torch.randn(L, C)
    w = torch.randn(C, 4)
    y, st = causal_conv1d_reference(x, w, torch.zeros(1, C, 3), torch.tensor([0, L]))
    hf = causal_conv1d_fn(x.T[None], w, activation="silu")[0].T
    torch.testing.assert_close(y, hf)
    torch.testing.assert_close(st[0], x[-3:].T)


def test_conv_state_carries_across_chunks(device) -> None:
    C = 20
    x = torch.randn(11, C, device=device)
    w = torch.randn(C, 4, device=device)
    full, st_full = causal_conv1d(
        x,
        w,
        torch.zeros(1, C, 3, device=device),
        torch.tensor([0, 11], dtype=torch.int32, device=device),
    )
    # 2 tokens, then 7, then 1-token decode steps
    st = torch.zeros(1, C, 3, device=device)
    parts = []
    for a, b in [(0, 2), (2, 9), (9, 10), (10, 11)]:
        y, st = causal_conv1d(
            x[a:b], w, st, torch.tensor([0, b - a], dtype=torch.int32, device=device)
        )
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st, st_full)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_varlen_matches_reference(device, dtype) -> None:
    C = 40
    lens = [5, 1, 0, 13]
    cu = torch.tensor([0, 5, 6, 6, 19], dtype=torch.int32, device=device)
    x = torch.randn(sum(lens), C, device=device, dtype=dtype)
    w = torch.randn(C, 4, device=device, dtype=dtype)
    state = torch.randn(4, C, 3, device=device, dtype=dtype)
    y, st = causal_conv1d(x, w, state, cu)
    y_ref, st_ref = causal_conv1d_reference(x, w, state, cu)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(st, st_ref)


def test_gdr_reference_matches_transformers() -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        torch_chunk_gated_delta_rule,
        torch_recurrent_gated_delta_rule,
    )

    T, hk, hv, dk, dv = 10, 1, 2, 16, 8
    q, k = torch.randn(T, hk, dk), torch.randn(T, hk, dk)
    v = torch.randn(T, hv, dv)
    g = -torch.rand(T, hv)
    beta = torch.rand(T, hv)
    s0 = torch.randn(1, hv, dk, dv)
    o, s = gated_delta_rule_reference(q, k, v, g, beta, s0, torch.tensor([0, T]))
    args = (q[None], k[None], v[None], g[None], beta[None])
    for fn in (torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule):
        o_hf, s_hf = fn(
            *args, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        torch.testing.assert_close(o, o_hf[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s, s_hf, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdr_kernel_matches_reference(device, dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    hk, hv, dk, dv = 2, 4, 32, 48  # dv not a multiple of the 32-wide value block
    cu = torch.tensor([0, 6, 7, 7, 12], dtype=torch.int32)
    T = 12
    q = torch.randn(T, hk, dk, generator=gen).to(device, dtype)
    k = torch.randn(T, hk, dk, generator=gen).to(device, dtype)
    v = torch.randn(T, hv, dv, generator=gen).to(device, dtype)
    g = (-torch.rand(T, hv, generator=gen)).to(device)
    beta = torch.rand(T, hv, generator=gen).to(device, dtype)
    s0 = torch.randn(4, hv, dk, dv, generator=gen).to(device)
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
    state = s0.clone()
    o = gated_delta_rule_recurrent(q, k, v, g, beta, state, cu.to(device))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gdr_decode_batch_gpu(device) -> None:
    B, hk, hv, dk, dv = 64, 16, 32, 128, 128
    q = torch.randn(B, hk, dk, device=device, dtype=torch.bfloat16)
    k = torch.randn(B, hk, dk, device=device, dtype=torch.bfloat16)
    v = torch.randn(B, hv, dv, device=device, dtype=torch.bfloat16)
    g = -torch.rand(B, hv, device=device)
    beta = torch.rand(B, hv, device=device, dtype=torch.bfloat16)
    s0 = torch.randn(B, hv, dk, dv, device=device)
    cu = torch.arange(B + 1, dtype=torch.int32, device=device)
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
    state = s0.clone()
    o = gated_delta_rule_recurrent(q, k, v, g, beta, state, cu)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(state, s_ref, rtol=1e-3, atol=1e-3)


# -- slot-indexed form: the state is the executor's slot pool, updated in place --------------


def _cu(lens: list[int], device: str) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def test_conv_slot_pool_in_place(device) -> None:
    C, S = 40, 6
    lens = [5, 1, 0, 13, 2]  # 1 and 2 tokens: the new state keeps part of the old one
    cu = _cu(lens, device)
    slots = torch.tensor([4, 0, 5, 2, 1], dtype=torch.int64, device=device)  # rows 3 idle
    gen = torch.Generator().manual_seed(3)
    proj = torch.randn(sum(lens), C + 24, generator=gen).to(device, torch.bfloat16)
    x = proj[:, 8 : 8 + C]  # a view of a wider projection output
    w = torch.randn(C, 4, generator=gen).to(device, torch.bfloat16)
    pool = torch.randn(S, C, 3, generator=gen).to(device, torch.bfloat16)
    before = pool.clone()
    y_ref, st_ref = causal_conv1d_reference(x, w, before[slots], cu)
    y, st = causal_conv1d(x, w, pool, cu, state_slots=slots)
    assert st is pool
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pool[slots], st_ref)
    assert torch.equal(pool[3], before[3])


def test_conv_slot_pool_prefill_then_decode(device) -> None:
    """Prefill chunks, then one-token decode steps of both sequences, on int32 slots of a
    pool: the outputs and final states equal one pass over each whole sequence."""
    C = 20
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(n, C, generator=gen).to(device) for n in (7, 4)]
    w = torch.randn(C, 4, generator=gen).to(device)
    pool = torch.zeros(4, C, 3, device=device)
    slots = torch.tensor([3, 1], dtype=torch.int32, device=device)
    y0, _ = causal_conv1d(
        torch.cat([xs[0][:5], xs[1][:2]]), w, pool, _cu([5, 2], device), state_slots=slots
    )
    outs = [[y0[:5]], [y0[5:]]]
    for i in range(2):
        y, _ = causal_conv1d(
            torch.stack([xs[0][5 + i], xs[1][2 + i]]),
            w,
            pool,
            _cu([1, 1], device),
            state_slots=slots,
        )
        outs[0].append(y[:1])
        outs[1].append(y[1:])
    for n, x in enumerate(xs):
        y_ref, st_ref = causal_conv1d_reference(
            x, w, torch.zeros(1, C, 3, device=device), _cu([len(x)], device)
        )
        torch.testing.assert_close(torch.cat(outs[n]), y_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[int(slots[n])], st_ref[0])
    assert not pool[0].any() and not pool[2].any()


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_gdr_slot_pool_in_place(device, slot_dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    hk, hv, dk, dv, S = 2, 4, 16, 24, 6
    lens = [6, 1, 0, 5]
    cu = _cu(lens, device)
    T = sum(lens)
    slots = torch.tensor([3, 0, 5, 1], dtype=slot_dtype, device=device)  # rows 2, 4 idle
    # q, k, v: views of one projection output [T, 2 hk dk + hv dv + pad] (no copies)
    qkv = torch.randn(T, 2 * hk * dk + hv * dv + 3, generator=gen).to(device, torch.bfloat16)
    q = qkv[:, : hk * dk].unflatten(-1, (hk, dk))
    k = qkv[:, hk * dk : 2 * hk * dk].unflatten(-1, (hk, dk))
    v = qkv[:, 2 * hk * dk : 2 * hk * dk + hv * dv].unflatten(-1, (hv, dv))
    gb = torch.rand(T, 2 * hv, generator=gen).to(device)
    gb[:, :hv] *= -1
    g, beta = gb[:, :hv], gb[:, hv:]  # views too
    pool = torch.randn(S, hv, dk, dv, generator=gen).to(device)
    before = pool.clone()
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, before[slots.long()], cu)
    o = gated_delta_rule_recurrent(q, k, v, g, beta, pool, cu, state_slots=slots)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pool[slots.long()], s_ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(pool[2], before[2]) and torch.equal(pool[4], before[4])


@pytest.mark.gpu
def test_slot_pools_at_qwen3_5_shapes_gpu(device) -> None:
    """Many T-blocks and channel blocks per sequence (Qwen3.5-9B widths), scattered slots."""
    lens, slots = [300, 1, 2, 77], [7, 2, 0, 5]
    cu = _cu(lens, device)
    sl = torch.tensor(slots, device=device)
    T, C, hk, hv, dk, dv = sum(lens), 8192, 16, 32, 128, 128
    proj = torch.randn(T, C + 100, device=device, dtype=torch.bfloat16)
    x = proj[:, 50 : 50 + C]
    w = torch.randn(C, 4, device=device, dtype=torch.bfloat16)
    pool = torch.randn(9, C, 3, device=device, dtype=torch.bfloat16)
    before = pool.clone()
    y_ref, st_ref = causal_conv1d_reference(x, w, before[sl], cu)
    y, _ = causal_conv1d(x, w, pool, cu, max_len=max(lens), state_slots=sl)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pool[sl], st_ref)
    assert torch.equal(pool[[1, 3, 4, 6, 8]], before[[1, 3, 4, 6, 8]])
    q = torch.randn(T, hk, dk, device=device, dtype=torch.bfloat16)
    k = torch.randn(T, hk, dk, device=device, dtype=torch.bfloat16)
    v = torch.randn(T, hv, dv, device=device, dtype=torch.bfloat16)
    g = -torch.rand(T, hv, device=device)
    beta = torch.rand(T, hv, device=device)
    s_pool = torch.randn(9, hv, dk, dv, device=device)
    s_before = s_pool.clone()
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s_before[sl], cu)
    o = gated_delta_rule_recurrent(q, k, v, g, beta, s_pool, cu, state_slots=sl)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(s_pool[sl], s_ref, rtol=1e-3, atol=1e-3)
    assert torch.equal(s_pool[[1, 3, 4, 6, 8]], s_before[[1, 3, 4, 6, 8]])

"""The chunked gated delta rule against the token-by-token reference, transformers' chunked rule
and the recurrent kernel (varlen, GQA value heads, ragged chunks, carried state)."""

from __future__ import annotations

import pytest
import torch

from kernels.gdn_chunk import gated_delta_rule_chunked
from kernels.gdn_recurrent import gated_delta_rule_recurrent, gated_delta_rule_reference


def _inputs(lens, hk, hv, dk, dv, dtype, device, seed=0):
    """Random q, k, v, g, beta, a non-zero initial state and cu_seqlens for sequences ``lens``."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)
    cu = torch.zeros(N + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    q = torch.randn(T, hk, dk, generator=gen).to(device, dtype)
    k = torch.randn(T, hk, dk, generator=gen).to(device, dtype)
    v = torch.randn(T, hv, dv, generator=gen).to(device, dtype)
    g = (-torch.rand(T, hv, generator=gen)).to(device)
    beta = torch.rand(T, hv, generator=gen).to(device, dtype)
    s0 = torch.randn(N, hv, dk, dv, generator=gen).to(device)
    return q, k, v, g, beta, s0, cu.to(device)


@pytest.mark.parametrize(
    "lens, chunk_size, dk, dv",
    [
        ([1, 17, 0, 40, 16], 16, 16, 24),  # length 1, empty, ragged and exact chunks
        ([70, 1, 64, 3], 64, 20, 16),  # the default chunk; Dk not a power of two
    ],
)
def test_chunked_matches_reference(device, lens, chunk_size, dk, dv) -> None:
    q, k, v, g, beta, s0, cu = _inputs(lens, 1, 2, dk, dv, torch.float32, device)
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
    state = s0.clone()
    o = gated_delta_rule_chunked(q, k, v, g, beta, state, cu, chunk_size=chunk_size)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


def test_chunked_matches_transformers_chunk_rule(device) -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    lens, chunk_size = [33, 1, 16, 7], 16
    q, k, v, g, beta, s0, cu = _inputs(lens, 2, 4, 16, 16, torch.float32, device, seed=1)
    state = s0.clone()
    o = gated_delta_rule_chunked(q, k, v, g, beta, state, cu, chunk_size=chunk_size)
    for n in range(len(lens)):
        a, b = int(cu[n]), int(cu[n + 1])
        # transformers' Qwen3.5 repeats q and k to the value heads before calling the rule
        qr, kr = (x.repeat_interleave(v.shape[1] // x.shape[1], dim=1) for x in (q, k))
        o_hf, s_hf = torch_chunk_gated_delta_rule(
            *(x[a:b][None].cpu() for x in (qr, kr, v, g, beta)),
            chunk_size=chunk_size,
            initial_state=s0[n : n + 1].cpu(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        torch.testing.assert_close(o[a:b].cpu(), o_hf[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(state[n : n + 1].cpu(), s_hf, rtol=1e-4, atol=1e-4)


def test_chunked_bf16_gqa(device) -> None:
    lens = [5, 19, 1]
    q, k, v, g, beta, s0, cu = _inputs(lens, 2, 4, 32, 48, torch.bfloat16, device, seed=2)
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
    state = s0.clone()
    o = gated_delta_rule_chunked(q, k, v, g, beta, state, cu, chunk_size=16)
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


def test_chunked_reads_strided_views_of_packed_qkv(device) -> None:
    """q, k, v as the executor passes them: head views of one packed [T, q | k | v] row."""
    lens, hk, hv, d = [21, 4], 1, 2, 16
    q, k, v, g, beta, s0, cu = _inputs(lens, hk, hv, d, d, torch.float32, device, seed=6)
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], 1)  # [T, (2 hk + hv) d]
    qs, ks, vs = qkv.split([hk * d, hk * d, hv * d], 1)
    qs, ks, vs = qs.unflatten(1, (hk, d)), ks.unflatten(1, (hk, d)), vs.unflatten(1, (hv, d))
    assert not vs.is_contiguous()
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
    state = s0.clone()
    o = gated_delta_rule_chunked(qs, ks, vs, g, beta, state, cu, chunk_size=16)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_then_recurrent_decode(device) -> None:
    """A chunked prefill leaves the state the recurrent decode continues from."""
    L, P = 23, 18
    q, k, v, g, beta, s0, cu = _inputs([L], 1, 2, 16, 16, torch.float32, device, seed=3)
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
    state = s0.clone()
    pre = gated_delta_rule_chunked(
        *(x[:P] for x in (q, k, v, g, beta)),
        state,
        torch.tensor([0, P], dtype=torch.int32, device=device),
        chunk_size=16,
    )
    outs = [pre]
    one = torch.tensor([0, 1], dtype=torch.int32, device=device)
    for t in range(P, L):
        outs.append(
            gated_delta_rule_recurrent(*(x[t : t + 1] for x in (q, k, v, g, beta)), state, one)
        )
    torch.testing.assert_close(torch.cat(outs), o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


def test_chunked_without_l2norm_custom_scale(device) -> None:
    lens = [9, 20]
    q, k, v, g, beta, s0, cu = _inputs(lens, 1, 1, 16, 16, torch.float32, device, seed=4)
    k = k * 0.2  # keep ||k|| small so the un-normalised rule stays bounded
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu, scale=0.3, qk_l2norm=False)
    state = s0.clone()
    o = gated_delta_rule_chunked(
        q, k, v, g, beta, state, cu, scale=0.3, qk_l2norm=False, chunk_size=16
    )
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


# Qwen3.5-9B Gated DeltaNet shapes: 16 key heads, 32 value heads, Dk = Dv = 128
@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[4096], [1, 1000, 2900, 64, 131]])
def test_chunked_real_shapes_gpu(device, lens) -> None:
    q, k, v, g, beta, s0, cu = _inputs(lens, 16, 32, 128, 128, torch.bfloat16, device, seed=5)
    state = s0.clone()
    o = gated_delta_rule_chunked(q, k, v, g, beta, state, cu)
    state_rec = s0.clone()
    o_rec = gated_delta_rule_recurrent(q, k, v, g, beta, state_rec, cu)
    torch.testing.assert_close(o.float(), o_rec.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(state, state_rec, rtol=1e-3, atol=1e-3)
    if len(lens) == 1:
        o_ref, s_ref = gated_delta_rule_reference(q, k, v, g, beta, s0, cu)
        torch.testing.assert_close(o.float(), o_ref.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(state, s_ref, rtol=1e-3, atol=1e-3)

from __future__ import annotations

import pytest
import torch
from test_paged_decode_kernel import build_paged

from kernels.kv_cache import KV_DTYPES
from kernels.paged_decode import paged_attention_decode
from kernels.paged_prefill import paged_attention_prefill, paged_attention_prefill_reference


def _sequences(gen, hkv, D, page, ctx, qlen, pages, fmts, dtype, device, scale_dtype):
    """Random keys and values of each sequence (its context `ctx[n]` plus a chunk of `qlen[n]`
    new tokens), their lengths, and the same keys and values written into a paged cache of
    `pages` pages (build_paged's (k, k_scale, v, v_scale, block tables))."""
    lens = [c + n for c, n in zip(ctx, qlen)]
    ks = [torch.randn(n, hkv, D, generator=gen) for n in lens]
    vs = [torch.randn(n, hkv, D, generator=gen) for n in lens]
    paged = build_paged(ks, vs, page, pages, *fmts, dtype, device, scale_dtype, gen)
    return lens, ks, vs, paged


def test_reference_matches_sdpa_on_dense_kv() -> None:
    gen = torch.Generator().manual_seed(0)
    hkv, G, D, page = 2, 2, 16, 4
    ctx, qlen = [0, 5, 3], [6, 3, 1]
    plain = ("plain", "plain")
    lens, ks, vs, (kd, _, vd, _, tables) = _sequences(
        gen, hkv, D, page, ctx, qlen, 16, plain, torch.float32, "cpu", torch.float32
    )
    q = torch.randn(sum(qlen), hkv * G, D, generator=gen)
    cu = torch.tensor([0, 6, 9, 10], dtype=torch.int32)
    ref = paged_attention_prefill_reference(q, kd, vd, tables, cu, torch.tensor(lens), 0.25)
    for n in range(3):
        qn = q[cu[n] : cu[n + 1]].transpose(0, 1)  # [Hq, t, D]
        k = ks[n].repeat_interleave(G, 1).transpose(0, 1)
        v = vs[n].repeat_interleave(G, 1).transpose(0, 1)
        # causal with the chunk at the end: query i sees keys 0..ctx+i
        mask = torch.ones(qlen[n], lens[n], dtype=torch.bool).tril(diagonal=ctx[n])
        dense = torch.nn.functional.scaled_dot_product_attention(
            qn, k, v, attn_mask=mask, scale=0.25
        )
        torch.testing.assert_close(
            ref[cu[n] : cu[n + 1]], dense.transpose(0, 1), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize(
    "kv_dtype,dtype",
    [
        ("auto", torch.float32),
        ("auto", torch.bfloat16),
        ("int8", torch.bfloat16),
        ("k8v4", torch.bfloat16),
    ],
)
def test_prefill_matches_reference(device, kv_dtype, dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    k_fmt, v_fmt = KV_DTYPES[kv_dtype]
    hkv, G, D, page = 1, 2, 32, 16
    ctx, qlen = [0, 20, 7], [13, 5, 1]
    lens, _, _, (kd, kscale, vd, vscale, tables) = _sequences(
        gen, hkv, D, page, ctx, qlen, 8, (k_fmt, v_fmt), dtype, device, torch.uint8
    )
    q = torch.randn(sum(qlen), hkv * G, D, generator=gen).to(device, dtype)
    cu = torch.tensor([0, 13, 18, 19], dtype=torch.int32, device=device)
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = {"k_scale": kscale, "v_scale": vscale, "k_fmt": k_fmt, "v_fmt": v_fmt}
    out = paged_attention_prefill(q, kd, vd, tables, cu, sl, D**-0.5, **kw)
    ref = paged_attention_prefill_reference(q, kd, vd, tables, cu, sl, D**-0.5, **kw)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    # a one-token chunk is a decode step: both kernels agree
    dec = paged_attention_decode(q[18:19], kd, vd, tables[2:3], sl[2:3], D**-0.5, **kw)
    torch.testing.assert_close(out[18:19].float(), dec.float(), rtol=tol, atol=tol)


@pytest.mark.gpu
def test_prefill_long_gpu(device) -> None:
    gen = torch.Generator().manual_seed(2)
    hkv, G, D, page = 4, 4, 128, 16
    ctx, qlen = [0, 3000, 100], [2048, 512, 1000]
    plain = ("plain", "plain")
    lens, _, _, (kd, _, vd, _, tables) = _sequences(
        gen, hkv, D, page, ctx, qlen, 500, plain, torch.bfloat16, device, torch.float32
    )
    q = torch.randn(sum(qlen), hkv * G, D, generator=gen).to(device, torch.bfloat16)
    cu = torch.tensor([0, 2048, 2560, 3560], dtype=torch.int32, device=device)
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    out = paged_attention_prefill(q, kd, vd, tables, cu, sl, D**-0.5)
    ref = paged_attention_prefill_reference(q, kd, vd, tables, cu, sl, D**-0.5)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)

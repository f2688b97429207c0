from __future__ import annotations

import pytest
import torch

from kernels.kv_cache import KV_DTYPES, alloc_kv_cache, dequantize_kv, quantize_kv, write_kv
from kernels.paged_decode import paged_attention_decode, paged_attention_decode_reference


def build_paged(
    seqs_k, seqs_v, page_size, num_pages, k_fmt, v_fmt, dtype, device, scale_dtype, gen
):
    """Scatter dense per-sequence K/V [n, Hkv, D] into randomly chosen pages."""
    hkv, D = seqs_k[0].shape[1:]
    kd, ks = alloc_kv_cache(num_pages, page_size, hkv, D, k_fmt, dtype, device, scale_dtype)
    vd, vs = alloc_kv_cache(num_pages, page_size, hkv, D, v_fmt, dtype, device, scale_dtype)
    max_pages = max(-(-k.shape[0] // page_size) for k in seqs_k) + 1
    perm = torch.randperm(num_pages, generator=gen)
    tables = torch.zeros(len(seqs_k), max_pages, dtype=torch.int32)
    used = 0
    for b, k in enumerate(seqs_k):
        n_pages = -(-k.shape[0] // page_size)
        tables[b, :n_pages] = perm[used : used + n_pages]
        used += n_pages
        t = torch.arange(k.shape[0])
        slots = tables[b].long()[t // page_size] * page_size + t % page_size
        write_kv(kd, ks, k.to(device), slots.to(device), k_fmt)
        write_kv(vd, vs, seqs_v[b].to(device), slots.to(device), v_fmt)
    return kd, ks, vd, vs, tables.to(device)


def test_reference_matches_dense_softmax_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    hkv, G, D, page = 2, 3, 16, 4
    lens = [1, 7, 12]
    ks = [torch.randn(n, hkv, D, generator=gen) for n in lens]
    vs = [torch.randn(n, hkv, D, generator=gen) for n in lens]
    kd, _, vd, _, tables = build_paged(
        ks, vs, page, 16, "plain", "plain", torch.float32, "cpu", torch.float32, gen
    )
    q = torch.randn(3, hkv * G, D, generator=gen)
    ref = paged_attention_decode_reference(q, kd, vd, tables, torch.tensor(lens), 0.3)
    for b, n in enumerate(lens):
        # dense: [Hq, 1, D] x [Hq, n, D] through torch's own attention
        k = ks[b].repeat_interleave(G, 1).transpose(0, 1)
        v = vs[b].repeat_interleave(G, 1).transpose(0, 1)
        dense = torch.softmax(q[b][:, None] @ k.transpose(1, 2) * 0.3, -1) @ v
        torch.testing.assert_close(ref[b], dense[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int8", "fp8", "nvfp4"])
def test_quantize_roundtrip_error_is_small(fmt) -> None:
    x = torch.randn(8, 2, 32)
    for sdt in (torch.float32, torch.uint8):
        data, scale = quantize_kv(x, fmt, scale_dtype=sdt)
        err = (dequantize_kv(data, scale, fmt) - x).abs().max() / x.abs().max()
        bound = {"int8": 0.005, "fp8": 0.07, "nvfp4": 0.2}[fmt]
        assert err < bound, (fmt, sdt, float(err))


CASES = [
    # (k_fmt, v_fmt, dtype, scale dtype of nvfp4)
    ("plain", "plain", torch.float32, torch.float32),
    ("plain", "plain", torch.bfloat16, torch.float32),
    ("plain", "plain", torch.float16, torch.float32),
    ("int8", "int8", torch.bfloat16, torch.float32),
    ("fp8", "fp8", torch.bfloat16, torch.float32),
    ("nvfp4", "nvfp4", torch.bfloat16, torch.uint8),
    ("nvfp4", "nvfp4", torch.float32, torch.float32),
    (*KV_DTYPES["k8v4"], torch.bfloat16, torch.uint8),
]


@pytest.mark.parametrize("k_fmt,v_fmt,dtype,sdt", CASES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(device, k_fmt, v_fmt, dtype, sdt, num_splits) -> None:
    gen = torch.Generator().manual_seed(2)
    hkv, G, D, page = 2, 2, 32, 16
    lens = [5, 40, 0, 17]  # includes an empty (padding) row
    ks = [torch.randn(max(n, 1), hkv, D, generator=gen) for n in lens]
    vs = [torch.randn(max(n, 1), hkv, D, generator=gen) for n in lens]
    kd, kscale, vd, vscale, tables = build_paged(
        ks, vs, page, 12, k_fmt, v_fmt, dtype, device, sdt, gen
    )
    q = torch.randn(len(lens), hkv * G, D, generator=gen).to(device, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = {"k_scale": kscale, "v_scale": vscale, "k_fmt": k_fmt, "v_fmt": v_fmt}
    out = paged_attention_decode(q, kd, vd, tables, seq_lens, D**-0.5, num_splits=num_splits, **kw)
    ref = paged_attention_decode_reference(q, kd, vd, tables, seq_lens, D**-0.5, **kw)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    assert torch.all(out[2] == 0)


def test_decode_head_dim_not_power_of_two(device) -> None:
    gen = torch.Generator().manual_seed(3)
    ks = [torch.randn(9, 1, 24, generator=gen)]
    vs = [torch.randn(9, 1, 24, generator=gen)]
    kd, _, vd, _, tables = build_paged(
        ks, vs, 4, 4, "plain", "plain", torch.float32, device, torch.float32, gen
    )
    q = torch.randn(1, 4, 24, generator=gen).to(device)
    sl = torch.tensor([9], dtype=torch.int32, device=device)
    out = paged_attention_decode(q, kd, vd, tables, sl, 0.2)
    torch.testing.assert_close(
        out, paged_attention_decode_reference(q, kd, vd, tables, sl, 0.2), rtol=1e-4, atol=1e-4
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8", "k8v4"])
def test_decode_long_context_gpu(device, kv_dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    k_fmt, v_fmt = KV_DTYPES[kv_dtype]
    hkv, G, D, page = 8, 4, 128, 16
    lens = [8191, 1, 3000, 20000]
    ks = [torch.randn(n, hkv, D, generator=gen) for n in lens]
    vs = [torch.randn(n, hkv, D, generator=gen) for n in lens]
    kd, kscale, vd, vscale, tables = build_paged(
        ks, vs, page, 2100, k_fmt, v_fmt, torch.bfloat16, device, torch.uint8, gen
    )
    q = torch.randn(len(lens), hkv * G, D, generator=gen).to(device, torch.bfloat16)
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = {"k_scale": kscale, "v_scale": vscale, "k_fmt": k_fmt, "v_fmt": v_fmt}
    out = paged_attention_decode(q, kd, vd, tables, sl, D**-0.5, **kw)
    ref = paged_attention_decode_reference(q, kd, vd, tables, sl, D**-0.5, **kw)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)

# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""Micro-benchmarks of the kernels on CUDA: ``python -m kernels.bench``.

Prints, per case, the time (triton.testing.do_bench median, ms) and the achieved rate as a
fraction of the roofline that bounds it (HBM bytes for GEMV/decode, bf16 FLOPs for big GEMM).
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from kernels.kv_cache import KV_DTYPES, alloc_kv_cache
from kernels.paged_decode import paged_attention_decode
from kernels.paged_prefill import paged_attention_prefill
from kernels.quant_gemm import quant_linear, quantize_weight_fp8, quantize_weight_nvfp4

HBM_BYTES_S = 4.8e12  # H200
BF16_FLOPS = 989e12  # H200 dense bf16


def bench_gemm() -> None:
    for N, K in ((8192, 8192), (28672, 4096)):
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        q8, s8 = quantize_weight_fp8(w)
        q4, s4, g4 = quantize_weight_nvfp4(w)
        for M in (1, 8, 64, 4096):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            t_bf = do_bench(lambda: x @ w.T)
            t8 = do_bench(lambda: quant_linear(x, q8, s8, "fp8"))
            t4 = do_bench(lambda: quant_linear(x, q4, s4, "nvfp4", g4))
            if M <= 64:
                r8 = (N * K + M * K * 2 + M * N * 2) / (t8 * 1e-3) / HBM_BYTES_S
                r4 = (N * K * 9 / 16 + M * K * 2 + M * N * 2) / (t4 * 1e-3) / HBM_BYTES_S
                unit = "of HBM"
            else:
                r8 = 2 * M * N * K / (t8 * 1e-3) / BF16_FLOPS
                r4 = 2 * M * N * K / (t4 * 1e-3) / BF16_FLOPS
                unit = "of bf16 peak"
            print(
                f"gemm N={N} K={K} M={M}: torch bf16 {t_bf:.4f} ms | fp8 {t8:.4f} ms "
                f"({r8:.0%} {unit}) | nvfp4 {t4:.4f} ms ({r4:.0%} {unit})"
            )


def bench_decode() -> None:
    B, hkv, G, D, page, L = 32, 8, 4, 128, 16, 4096
    pages = B * L // page
    bt = torch.arange(pages, dtype=torch.int32, device="cuda").view(B, -1)
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    q = torch.randn(B, hkv * G, D, device="cuda", dtype=torch.bfloat16)
    for kv in ("auto", "fp8", "nvfp4", "k8v4"):
        kf, vf = KV_DTYPES[kv]
        kd, ks = alloc_kv_cache(pages, page, hkv, D, kf, torch.bfloat16, "cuda", torch.uint8)
        vd, vs = alloc_kv_cache(pages, page, hkv, D, vf, torch.bfloat16, "cuda", torch.uint8)
        kd.view(torch.uint8).random_(0, 100)
        vd.view(torch.uint8).random_(0, 100)
        if ks is not None:
            ks.fill_(0.01 if ks.dtype == torch.float32 else 0x20)
        if vs is not None:
            vs.fill_(0.01 if vs.dtype == torch.float32 else 0x20)
        nbytes = sum(t.numel() * t.element_size() for t in (kd, ks, vd, vs) if t is not None)
        t = do_bench(
            lambda: paged_attention_decode(
                q, kd, vd, bt, sl, D**-0.5, k_scale=ks, v_scale=vs, k_fmt=kf, v_fmt=vf
            )
        )
        print(
            f"decode B={B} L={L} Hkv={hkv} G={G} D={D} kv={kv}: {t:.4f} ms, "
            f"{nbytes / (t * 1e-3) / HBM_BYTES_S:.0%} of HBM"
        )


def bench_prefill() -> None:
    T, hkv, G, D, page = 8192, 8, 4, 128, 16
    kd, _ = alloc_kv_cache(T // page, page, hkv, D, "plain", torch.bfloat16, "cuda")
    vd, _ = alloc_kv_cache(T // page, page, hkv, D, "plain", torch.bfloat16, "cuda")
    kd.normal_()
    vd.normal_()
    q = torch.randn(T, hkv * G, D, device="cuda", dtype=torch.bfloat16)
    bt = torch.arange(T // page, dtype=torch.int32, device="cuda")[None]
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    sl = torch.tensor([T], dtype=torch.int32, device="cuda")
    t = do_bench(lambda: paged_attention_prefill(q, kd, vd, bt, cu, sl, D**-0.5, max_q_len=T))
    flops = 2 * 2 * T * T / 2 * hkv * G * D
    qt = q.view(1, T, hkv * G, D).transpose(1, 2)
    kt = kd.view(1, T, hkv, D).transpose(1, 2).repeat_interleave(G, 1)
    vt = vd.view(1, T, hkv, D).transpose(1, 2).repeat_interleave(G, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    t_ref = do_bench(lambda: sdpa(qt, kt, vt, is_causal=True))
    print(
        f"prefill T={T} Hq={hkv * G} D={D}: {t:.3f} ms ({flops / (t * 1e-3) / BF16_FLOPS:.0%} "
        f"of bf16 peak); torch sdpa (dense) {t_ref:.3f} ms"
    )


if __name__ == "__main__":
    bench_gemm()
    bench_decode()
    bench_prefill()

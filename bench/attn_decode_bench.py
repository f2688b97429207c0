"""Decode attention at Qwen3-8B shapes (32 query / 8 KV heads of 128, q/k norm, full rotary,
bf16 KV): kernels.attn_prologue then kernels.paged_decode's decode and merge, and each part
alone, timed as a chain of 36 calls (one per layer) captured in a CUDA Graph, as a decode step
runs them. Between the attention calls a small PDL kernel stands in for the projections, so
each call starts behind another kernel as it does in the model.

    python3 bench/attn_decode_bench.py [--batch 1,8] [--context 512,2048] [--reps 50]

Prints microseconds per call (median over graph replays, net of the stand-in kernels) for each
route, batch and context.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from kernels.attn_prologue import attention_prologue
from kernels.kv_cache import alloc_kv_cache
from kernels.launch import pdl_args, pdl_wait
from kernels.paged_decode import paged_attention_decode
from kernels.rotary import rope_inv_freq

H, HKV, D, LAYERS, PAGE = 32, 8, 128, 36, 16


@triton.jit
def _between_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


def _setup(B: int, ctx: int, dev: torch.device) -> dict:
    pages = -(-(ctx + 64) // PAGE)
    kc, _ = alloc_kv_cache(B * pages, PAGE, HKV, D, "plain", torch.bfloat16, dev)
    vc, _ = alloc_kv_cache(B * pages, PAGE, HKV, D, "plain", torch.bfloat16, dev)
    kc.normal_()
    vc.normal_()
    tables = torch.arange(B * pages, dtype=torch.int32, device=dev).view(B, pages)
    pos = torch.full((B,), ctx - 1, dtype=torch.int32, device=dev)
    slots = tables[:, (ctx - 1) // PAGE] * PAGE + (ctx - 1) % PAGE
    qkv = torch.randn(B, (H + 2 * HKV) * D, device=dev, dtype=torch.bfloat16)
    return {
        "q": qkv[:, : H * D].unflatten(-1, (H, D)),
        "k": qkv[:, H * D : (H + HKV) * D].unflatten(-1, (HKV, D)),
        "v": qkv[:, (H + HKV) * D :].unflatten(-1, (HKV, D)),
        "pos": pos,
        "inv": rope_inv_freq(D, 1e6, dev),
        "w": torch.randn(D, device=dev, dtype=torch.bfloat16),
        "slots": slots.contiguous(),
        "tables": tables,
        "lens": torch.full((B,), ctx, dtype=torch.int32, device=dev),
        "kv": {"k_cache": kc, "v_cache": vc},
        "other": torch.empty(H * D * B, device=dev, dtype=torch.bfloat16),
    }


def _prologue(s: dict) -> torch.Tensor:
    return attention_prologue(s["q"], s["k"], s["v"], s["pos"], s["inv"], q_norm_w=s["w"],
                              k_norm_w=s["w"], slots=s["slots"], **s["kv"])  # fmt: skip


def _decode(s: dict, q: torch.Tensor, **kw) -> torch.Tensor:
    return paged_attention_decode(q, block_tables=s["tables"], seq_lens=s["lens"],
                                  scale=D**-0.5, **s["kv"], **kw)  # fmt: skip


def _unfused(s: dict, **kw) -> torch.Tensor:
    return _decode(s, _prologue(s), **kw)


# name -> route; keyword arguments are launch choices of paged_attention_decode
ROUTES = {
    "prologue+decode": _unfused,
    "prologue only": _prologue,
    "decode only": lambda s: _decode(s, s["q"]),
    "decode bn32": lambda s: _decode(s, s["q"], block_n=32),
    "decode w8": lambda s: _decode(s, s["q"], num_warps=8),
}


def _between(s: dict, x: torch.Tensor) -> None:
    n = x.numel()
    _between_kernel[(triton.cdiv(n, 1024),)](x, s["other"], n, BLOCK=1024, **pdl_args(x.device))


def time_route(route, s: dict, reps: int, with_attention: bool = True) -> float:
    """Microseconds per layer of a graph of LAYERS x (attention, between-kernel)."""

    def chain() -> None:
        for _ in range(LAYERS):
            out = route(s) if with_attention else s["q"]
            _between(s, out)

    chain()  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / LAYERS)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,8")
    p.add_argument("--context", default="512,2048")
    p.add_argument("--reps", type=int, default=50)
    dev = torch.device("cuda")
    p.add_argument("--routes", default=",".join(ROUTES))
    args = p.parse_args()
    dev = torch.device("cuda")
    routes = args.routes.split(",")
    print("us per call, net of the between-kernel chain")
    print(
        f"{'batch':>5} {'context':>7} {'between':>8} " + " ".join(f"{r:>{len(r)}}" for r in routes)
    )
    for B in map(int, args.batch.split(",")):
        for ctx in map(int, args.context.split(",")):
            s = _setup(B, ctx, dev)
            base = time_route(None, s, args.reps, with_attention=False)
            cells = [f"{time_route(ROUTES[r], s, args.reps) - base:{len(r)}.2f}" for r in routes]
            print(f"{B:5d} {ctx:7d} {base:8.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()

"""Where a decode step's GPU time goes: per-kernel time of one eager decode step (torch
profiler), next to the CUDA Graph replay time of the same step, for a synthetic model.

    python3 bench/profile_step.py --synthetic qwen3-8b --weights bf16 --batch 1 --context 512

Prints one table per model: kernel name, launches per step, microseconds per step, share of
the kernels' sum; then the sum of kernel times, the eager step's wall time and the graph
replay's time. The gap between the kernels' sum and the graph replay is launch/tail overhead
between kernels; the kernels' sum against the weights' copy time is kernel efficiency.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import torch


def _short(name: str) -> str:
    name = re.sub(r"\(.*", "", name)
    for key in ("gemv", "gemm", "Kernel", "cutlass", "sm90", "nvjet"):
        if key in name and len(name) > 60:
            return name[:60]
    return name


def profile(args: argparse.Namespace) -> None:
    from ninfer.passes.options import CompileOptions
    from ninfer.passes.pipeline import compile_artifact
    from ninfer.runtime.cuda_executor import make_executor
    from ninfer.runtime.cuda_synthetic import build_synthetic
    from ninfer.runtime.step import SeqChunk, StepBatch

    source, _ = build_synthetic(args.synthetic, args.weights, "cuda")
    page, B, ctx = 16, args.batch, args.context
    pages_per = -(-(ctx + 64) // page)
    opts = CompileOptions(device="cuda", kv_dtype=args.kv_dtype, max_concurrency=B, max_context=pages_per * page,
                          kv_capacity=B * pages_per * page, page_size=page, prefill_chunk=max(1024, ctx))  # fmt: skip
    plan = compile_artifact(source, opts)
    ex = make_executor(plan, source, "cuda", collect_timings=True)
    del source
    vocab = int(plan.model["vocab"])
    gen = torch.Generator().manual_seed(0)
    tables = [tuple(range(i * pages_per, (i + 1) * pages_per)) for i in range(B)]
    slots = list(range(B)) if ex.is_hybrid else [None] * B
    prompt = [torch.randint(0, vocab, (ctx,), generator=gen).tolist() for _ in range(B)]
    ex.run(
        StepBatch(tuple(SeqChunk(i, tuple(prompt[i]), 0, tables[i], slots[i]) for i in range(B)))
    )

    def decode(pos: int) -> StepBatch:
        return StepBatch(tuple(SeqChunk(i, (1,), pos, tables[i], slots[i]) for i in range(B)))

    buckets = ex.graph_buckets
    ex.graph_buckets = set()  # eager first
    for p in range(3):
        ex.run(decode(ctx + p))
    torch.cuda.synchronize()
    steps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for p in range(steps):
            ex.run(decode(ctx + 3 + p))
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = _short(e.name)
            per[k][0] += 1
            per[k][1] += (
                e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            )
    total = sum(v[1] for v in per.values()) / steps
    n_kernels = sum(v[0] for v in per.values()) / steps
    print(
        f"\n== {args.synthetic} {args.weights} kv={args.kv_dtype or 'bf16'} batch {B} context {ctx}"
    )
    print(f"{'kernel':62} {'n/step':>7} {'us/step':>9} {'share':>6}")
    for k, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:62} {n / steps:7.1f} {us / steps:9.1f} {100 * us / steps / total:5.1f}%")
    ex.records.clear()
    for p in range(steps):
        ex.run(decode(ctx + 10 + p))
    torch.cuda.synchronize()
    eager = sorted(r.gpu_s() for r in ex.records)[steps // 2] * 1e3
    ex.graph_buckets = buckets
    ex.records.clear()
    for p in range(20):
        ex.run(decode(ctx + 20 + p))
    torch.cuda.synchronize()
    graph = sorted(r.gpu_s() for r in ex.records if r.graph)
    g = graph[len(graph) // 2] * 1e3 if graph else float("nan")
    wb = ex.weight_bytes / 1e9
    print(f"kernels/step {n_kernels:.0f}; kernel sum {total / 1e3:.3f} ms; eager step {eager:.3f} ms; "
          f"graph step {g:.3f} ms; weights {wb:.2f} GB")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--synthetic", default="qwen3-8b")
    p.add_argument("--weights", default="bf16")
    p.add_argument("--kv-dtype", default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    profile(p.parse_args())


if __name__ == "__main__":
    main()

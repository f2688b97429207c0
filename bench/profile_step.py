"""Where a decode step's GPU time goes: per-kernel time of one eager decode step (torch
profiler), next to the CUDA Graph replay time of the same step, for a synthetic model.

    python3 bench/profile_step.py --synthetic qwen3-8b --weights bf16 --batch 1 --context 512

Prints one table per model: kernel name, launches per step, microseconds per step, share of
the kernels' sum; then the sum of kernel times, the eager step's wall time and the graph
replay's time. The gap between the kernels' sum and the graph replay is launch/tail overhead
between kernels; the kernels' sum against the weights' copy time is kernel efficiency. `--ablate norms,merge`
then times the graph step again with each part removed: what that part costs inside the graph;
`--variant` with other launch shapes from the kernel tables.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections import defaultdict

import torch
import triton
import triton.language as tl

from kernels.launch import pdl_args, pdl_wait


def _short(name: str) -> str:
    name = re.sub(r"\(.*", "", name)
    for key in ("gemv", "gemm", "Kernel", "cutlass", "sm90", "nvjet"):
        if key in name and len(name) > 60:
            return name[:60]
    return name


def profile(args: argparse.Namespace) -> None:
    from ninfer.bench.synthetic import build_synthetic
    from ninfer.passes.options import CompileOptions
    from ninfer.passes.pipeline import compile_artifact
    from ninfer.runtime.executors.cuda.executor import make_executor
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

    def graph_ms() -> float:
        ex.drop_graphs()
        ex.records.clear()
        for p in range(20):
            ex.run(decode(ctx + 40 + p))
        torch.cuda.synchronize()
        t = sorted(r.gpu_s() for r in ex.records if r.graph)
        return t[len(t) // 2] * 1e3

    def against_full(label: str, change) -> None:
        """The graph step under ``change()`` (a context manager) against the full step, three
        times alternating so that drift in clocks falls on both sides; the median pair."""
        runs = []
        for _ in range(3):
            full = graph_ms()
            with change():
                runs.append((full, graph_ms()))
        full, other = sorted(runs, key=lambda r: r[0] - r[1])[1]
        print(f"graph step {label}: {other:.3f} ms against {full:.3f} ms "
              f"(saves {full - other:+.3f} ms; all: "
              + " ".join(f"{a - b:+.3f}" for a, b in runs) + ")")  # fmt: skip

    for name in args.ablate.split(",") if args.ablate else []:
        against_full(f"without {name}", lambda name=name: _ablated(name, ex))
    for spec in args.variant:
        against_full(f"with {spec}", lambda spec=spec: _table_variant(spec))
    ex.drop_graphs()


def _table_entry(item: str) -> tuple[dict, tuple, object]:
    """One `--variant` item, `TABLE N:K[:glu]:M=CFG`: the launch table (fp8_mma, nvfp4_mma,
    fp8_gemv or nvfp4), its key, and the config CFG (comma-separated fields, or `none`: the other
    path)."""
    from kernels import fp8_gemv, fp8_mma, nvfp4_gemv

    name, rest = item.split(None, 1)
    where, cfg = rest.replace(" ", "").split("=")
    n, k, *more = (int(v) for v in where.split(":"))
    make = {"fp8_mma": (fp8_mma.TABLE, fp8_mma.Fp8MmaConfig),
            "nvfp4_mma": (fp8_mma.NVFP4_TABLE, fp8_mma.Fp8MmaConfig),
            "fp8_gemv": (fp8_gemv.TABLE, fp8_gemv.Fp8GemvConfig),
            "nvfp4": (nvfp4_gemv.TABLE, nvfp4_gemv.Nvfp4GemvConfig)}  # fmt: skip
    if name == "dense":  # chosen when the plan is compiled, not at run time
        raise SystemExit(
            "--variant dense: dense GEMM launches are the plan's (ninfer/passes/gemm_launch.py); "
            "edit kernels/gemv_table.json and profile again"
        )
    if name not in make:
        raise SystemExit(f"--variant: unknown table {name!r} (fp8_mma, nvfp4_mma, fp8_gemv, nvfp4)")
    table, config_type = make[name]
    key = (n, k, *more) if name == "nvfp4" else (n, k, bool(more[0]), more[1])
    fields = [int(v) for v in cfg.split(",")] if cfg != "none" else None
    if name == "nvfp4" and fields is not None and len(fields) == 4:
        fields[3] = bool(fields[3])
    return table, key, None if fields is None else config_type(*fields)


@contextlib.contextmanager
def _table_variant(spec: str):
    """The decode step with launch-table entries replaced (`--variant`, items joined by `;`):
    what another launch shape for a weight does inside the captured step."""
    entries = [_table_entry(item) for item in spec.split(";") if item.strip()]
    saved = [(table, key, table.get(key, KeyError)) for table, key, _ in entries]
    for table, key, cfg in entries:
        table[key] = cfg
    try:
        yield
    finally:
        for table, key, old in saved:
            if old is KeyError:
                table.pop(key, None)
            else:
                table[key] = old


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def _copy(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024, **pdl_args(x.device))
    return y


@contextlib.contextmanager
def _ablated(name: str, ex):
    """What-if timing: the decode step with one kind of work removed (its outputs are wrong;
    the residual stream stays bounded so no kernel takes a slow path). `norms`: RMSNorm returns
    its input; `prologue`: the attention prologue (q/k norm, rotary, KV write); `merge`: the
    split-attention merge; `attention`: the whole attention op; `copy`: the attention op as
    one kernel that copies q (against `attention`: what one more kernel in the chain costs);
    `proj:NxK`: the projections with an [N, K] weight (K of the input x) return zeros.
    Swaps the implementations `ex` resolved from the plan (by op kind) for the block."""
    from kernels import paged_decode
    from ninfer.runtime.executors.cuda import ops as cuda_ops

    ops: dict = {}  # op kind -> (the plan's implementation -> its replacement)
    saved = (None, cuda_ops.attention_prologue, paged_decode._merge_kernel,
             cuda_ops.paged_attention_decode)  # fmt: skip
    if name == "norms":
        ops["rmsnorm"] = lambda impl: lambda s, a, x, w: x
        ops["add_rmsnorm"] = lambda impl: lambda s, a, x, r, w: (r, r)
    elif name == "prologue":
        cuda_ops.attention_prologue = lambda q, *rest, **kw: q
    elif name == "merge":  # the output then stays as first made: zeros, not whatever was there
        paged_decode._merge_kernel = defaultdict(lambda: lambda *a, **k: None)
        zeros: dict[tuple, torch.Tensor] = {}

        def decode_into_zeros(q, *rest, **kw):
            if tuple(q.shape) not in zeros:  # made in the warm-up before capture
                zeros[tuple(q.shape)] = torch.zeros_like(q)
            return saved[3](q, *rest, out=zeros[tuple(q.shape)], **kw)

        cuda_ops.paged_attention_decode = decode_into_zeros
    elif name == "attention":
        ops["attention"] = lambda impl: lambda s, a, q, *rest: q
    elif name == "copy":  # the attention op as one trivial kernel: the cost of a kernel boundary
        ops["attention"] = lambda impl: lambda s, a, q, *rest: _copy(q)
    elif name.startswith("proj:"):  # proj:NxK, the projections of weight [N, K]: zeros instead
        shape = tuple(int(v) for v in name[5:].split("x"))
        made: dict[tuple, torch.Tensor] = {}

        def zeroed(impl):
            return lambda s, a, x, w, *rest: _zero_proj(impl, shape, made, s, a, x, w, *rest)

        ops["linear"] = zeroed
    else:
        raise SystemExit(f"--ablate: unknown part {name!r}")
    plan_impls = (list(ex._step_impls), list(ex._decode_impls))
    for impls in (ex._step_impls, ex._decode_impls):
        for i, call in enumerate(ex.plan.calls):
            if call.op in ops:
                impls[i] = ops[call.op](impls[i])
    try:
        yield
    finally:
        ex._step_impls, ex._decode_impls = plan_impls
        cuda_ops.attention_prologue, paged_decode._merge_kernel = saved[1], saved[2]
        cuda_ops.paged_attention_decode = saved[3]


def _zero_proj(impl, shape, made, s, a, x, w, *rest):
    """A projection of weight `shape` returning zeros (made once, in the warm-up before capture);
    other projections run `impl`."""
    from ninfer.runtime.executors.cuda import ops as cuda_ops

    xs = getattr(x, "s", x)  # a NormedX input carries its rows as s
    ws = (w.out_features, xs.shape[-1]) if hasattr(w, "out_features") else tuple(w.shape)
    if ws != shape:
        return impl(s, a, x, w, *rest)
    key = (tuple(xs.shape), a.get("out"))
    if key not in made:
        out = impl(s, a, x, w, *rest)
        if isinstance(out, cuda_ops._PendingProjection):  # left for its residual add,
            out = xs.new_zeros((xs.shape[0], ws[0]))  # which then runs unfused instead
        made[key] = torch.zeros_like(out)
    return made[key]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--synthetic", default="qwen3-8b")
    p.add_argument("--weights", default="bf16")
    p.add_argument("--kv-dtype", default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument(
        "--ablate", default="", help="comma list of norms,prologue,merge,attention,copy,proj:NxK"
    )
    p.add_argument(
        "--variant", action="append", default=[],
        help="time the step with launch-table entries replaced, e.g. "
        "'fp8_mma 6144:4096:0:1=4,2,0; fp8_gemv 6144:4096:0:1=none' (repeatable)",
    )  # fmt: skip
    profile(p.parse_args())


if __name__ == "__main__":
    main()

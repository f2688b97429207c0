"""`ninfer bench`: latency and throughput against the hardware limit and against transformers.

    ninfer bench engine ARTIFACT | --synthetic NAME [--weights bf16|fp8|nvfp4 [--quantize-lm-head]]
                 [--batch-sizes 1,8] [--input-len 512] [--output-len 128] [--peer transformers]
    ninfer bench serve --url http://127.0.0.1:8080 [--concurrency 1,8] [--artifact A]

engine: the in-process engine (scheduler, executor, sampler: everything but HTTP) runs b
requests submitted together for each batch size b. serve: a load generator against a running
`ninfer serve` over streaming Chat Completions (like `vllm bench serve`; distinct prompts of
exactly --input-len tokens: ninfer.commands.bench_serve). Both report TTFT, TPOT
and ITL percentiles and output tok/s (ninfer.bench.loadgen), the ratio to the limit
(decode: bytes read per step ÷ copy bandwidth; prefill: FLOPs ÷ the matmul rate in the plan's
compute dtype, both measured on the device in the same run: ninfer.bench.limits), and in engine mode the host
time per decode step and, with `--peer transformers`, the same workload through transformers
on the same weights. `--json PATH` / `--md PATH` write the report.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ninfer.commands import bench_vision
from ninfer.commands.bench_report import command_line, format_markdown, format_report, write_report
from ninfer.errors import ConfigError

PEERS = ("transformers",)


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input-len", type=int, default=512, help="prompt tokens per request (default 512)"
    )
    p.add_argument(
        "--output-len", type=int, default=128, help="output tokens per request (default 128)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random prompts (and synthetic weights)"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    p.add_argument(
        "--md", default=None, metavar="PATH", help="write the report as a Markdown table"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    e = sub.add_parser("engine", help="offline load through the in-process engine")
    e.add_argument("artifact", nargs="?", default=None, help=".ninfer file (or use --synthetic)")
    e.add_argument(
        "--synthetic", default=None, help="random weights of a real shape, made on the device"
    )
    e.add_argument("--weights", default="bf16", help="synthetic weight format: bf16 | fp8 | nvfp4")
    e.add_argument("--quantize-lm-head", action="store_true", help="synthetic: head in --weights")
    e.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    e.add_argument(
        "--dtype", default=None, help="compute dtype (default: float32 on cpu, bfloat16 on cuda)"
    )
    e.add_argument(
        "--kv-dtype", default=None, help="KV cache storage (default: the compile default)"
    )
    e.add_argument(
        "--batch-sizes",
        type=_ints,
        default=[1],
        help="comma-separated batch sizes, 1..8 (default 1)",
    )
    e.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="prefill tokens per step (default: max(1024, input-len))",
    )
    e.add_argument("--page-size", type=int, default=16)
    e.add_argument(
        "--kv-capacity", default=None, help="KV tokens: N | auto (default: what the batches need)"
    )
    e.add_argument("--no-cuda-graph", action="store_true", help="run decode eagerly")
    e.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="shard an ARTIFACT over N ranks (N GPUs; docs/design.md, Tensor parallelism)",
    )
    e.add_argument(
        "--no-overlap",
        action="store_true",
        help="wait for each step's tokens before launching the next decode step",
    )
    e.add_argument(
        "--peer", default=None, choices=PEERS, help="run the same workload through this peer"
    )
    e.add_argument("--hf-dir", help="the Hugging Face directory an ARTIFACT came from (--peer)")
    e.add_argument(
        "--spec",
        choices=("draft", "mtp", "dflash", "verify"),
        help="draft | mtp (the artifact's MTP head) | dflash (its DFlash drafter): speculative "
        "vs plain decoding; verify: "
        "the verify/decode step cost",
    )
    e.add_argument("--draft-model", metavar="DRAFT", help="--spec draft: the draft model")
    e.add_argument(
        "--lm-head-draft", action="store_true", help="--spec mtp|dflash: the reduced draft head"
    )
    e.add_argument("--draft-tokens", type=int, default=4, metavar="K", help="drafts per round")
    e.add_argument("--prompts", metavar="FILE", help="--spec: one user message per line")
    e.add_argument("--reps", type=int, default=20, help="--spec: repetitions of each step timing")
    bench_vision.add_arguments(e)  # --images N --image-size WxH, then _common(e)
    s = sub.add_parser("serve", help="streaming load against a running `ninfer serve`")
    s.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    s.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    s.add_argument("--api-key", default=None)
    s.add_argument(
        "--concurrency", type=_ints, default=[1], help="comma-separated concurrency levels"
    )
    s.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests per level (default: the concurrency)",
    )
    s.add_argument("--artifact", default=None, help="the served artifact, to compute the limit")
    s.add_argument(
        "--device",
        default=None,
        help="device to measure the limit on (default: cuda when available)",
    )
    s.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="the server's --max-concurrency (for the plan)",
    )
    _common(s)


def run(args: argparse.Namespace) -> int:
    if args.input_len < 1 or args.output_len < 2:
        raise ConfigError("--input-len must be >= 1 and --output-len >= 2")
    if args.mode == "engine" and args.images:  # image prefill (its own load and report)
        return bench_vision.run(args)
    if args.mode == "engine" and args.spec:  # plain vs speculative (ninfer.commands.bench_spec)
        from ninfer.commands import bench_spec

        if args.spec == "verify":
            report = bench_spec.run_verify_cost(args)
            print(bench_spec.format_verify_report(report))
        else:
            report = bench_spec.run_spec_bench(args)
            print(bench_spec.format_spec_report(report))
        write_report(report, args)
        return 0
    if args.mode == "engine":
        report = run_engine(args)
    else:
        from ninfer.commands.bench_serve import run_serve

        report = run_serve(args)
    report["command"] = command_line()
    print(format_report(report))
    write_report(report, args, format_markdown)
    return 0


def _default_device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + batch)
    return torch.randint(10, max(vocab - 10, 11), (batch, length), generator=g).tolist()


def limit_figures(
    summary: dict[str, Any], work: Any, ceilings: Any, batch: int, input_len: int, output_len: int
) -> dict[str, Any]:
    """The limit ratios of one load (see ninfer.bench.limits)."""
    context = input_len + output_len // 2
    step_bytes = work.decode_bytes(batch, context)
    limit_step_s = step_bytes / ceilings.copy_bytes_per_s
    tpot = summary["tpot_ms"]["p50"]
    out: dict[str, Any] = {
        "decode_bytes_per_step": step_bytes,
        "decode_limit_tok_per_s": batch / limit_step_s,
        "decode_tok_per_s": batch / (tpot / 1e3) if tpot else None,
        "decode_ratio": (limit_step_s * 1e3 / tpot) if tpot else None,
    }
    ttft_max = summary["ttft_ms"]["p99"]
    flops = batch * work.prefill_flops(input_len)
    out["prefill_flops"] = flops
    out["prefill_flops_per_s"] = flops / (ttft_max / 1e3) if ttft_max else None
    out["prefill_ratio"] = (
        out["prefill_flops_per_s"] / ceilings.matmul_flops_per_s if ttft_max else None
    )
    return out


def _step_stats(ex: Any, batch: int, limit_tok_per_s: float | None) -> dict[str, Any]:
    """Per-step figures from the executor's records. Steady decode: `batch` / the median
    interval between the `run` entries of a decode step of all `batch` rows and the next step
    (the whole engine step: GPU, sampling, host work). Unlike batch / TPOT it leaves out the
    prefill steps of other requests that a request's TPOT window also contains."""
    import itertools
    import statistics

    import torch

    from ninfer.bench.loadgen import percentiles

    every = list(getattr(ex, "records", []))
    recs = [r for r in every if r.decode]
    if not recs:
        return {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    gpu = [r.gpu_s() for r in recs if r.start is not None]
    out = {
        "decode_steps": len(recs),
        "graph_steps": sum(r.graph for r in recs),
        "host_ms_per_decode_step": percentiles([r.host_s for r in recs]),
        "gpu_ms_per_decode_step": percentiles([g for g in gpu if g is not None]),
    }
    gaps = [
        b.entered_s - a.entered_s
        for a, b in itertools.pairwise(every)
        if a.decode and a.rows == batch and a.entered_s and b.entered_s
    ]
    if gaps:
        steady = batch / statistics.median(gaps)
        out["steady_decode_tok_per_s"] = steady
        out["steady_decode_steps"] = len(gaps)
        if limit_tok_per_s:
            out["steady_decode_ratio"] = steady / limit_tok_per_s
    return out


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ninfer.bench.limits import measure_ceilings, work_model
    from ninfer.bench.loadgen import engine_load, summarise
    from ninfer.passes.options import parse_kv_capacity
    from ninfer.runtime.build import build_engine
    from ninfer.runtime.config import EngineOptions

    if (args.artifact is None) == (args.synthetic is None):
        raise ConfigError("give an ARTIFACT or --synthetic NAME (not both)")
    if args.synthetic and args.tensor_parallel > 1:
        raise ConfigError(
            "--tensor-parallel: the ranks load their parts from a file; give an ARTIFACT "
            "(convert the synthetic model's Hugging Face directory first), not --synthetic"
        )
    if max(args.batch_sizes) > 8:
        raise ConfigError("--batch-sizes: at most 8 (the engine's --max-concurrency range)")
    device = _default_device(args.device)
    hf = None
    t0 = time.perf_counter()
    if args.synthetic:
        from ninfer.bench.synthetic import build_synthetic

        source, hf = build_synthetic(
            args.synthetic, args.weights, device, args.seed, args.quantize_lm_head
        )
    else:
        from ninfer.artifact import Artifact

        source = Artifact(args.artifact)
        if args.peer:
            if not args.hf_dir:
                raise ConfigError(
                    "--peer transformers with an ARTIFACT needs --hf-dir (the model it was converted from)"
                )
            import transformers

            dtype = (
                torch.float32
                if (args.dtype or ("float32" if device == "cpu" else "bfloat16")) == "float32"
                else torch.bfloat16
            )
            hf = (
                transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=dtype)
                .to(device)
                .eval()
            )
    page = args.page_size
    maxb = max(args.batch_sizes)
    ctx = -(-(args.input_len + args.output_len + 1) // page) * page
    options = EngineOptions.of(
        device=device, dtype=args.dtype, kv_dtype=args.kv_dtype, max_concurrency=maxb,
        max_context=ctx, kv_capacity=parse_kv_capacity(args.kv_capacity) or maxb * ctx,
        page_size=page, prefill_chunk=args.prefill_chunk or max(1024, args.input_len),
        cuda_graphs=not args.no_cuda_graph, prefix_reuse=False, max_pending_requests=maxb,
        default_max_tokens=args.output_len, overlap=not args.no_overlap,
        collect_timings=device.startswith("cuda"), tensor_parallel=args.tensor_parallel,
    )  # fmt: skip
    engine = build_engine(source, options)  # CUDA Graphs are captured here
    plan, ex = engine.plan, engine.executor
    if hf is None or args.peer is None:
        hf = None
    del source
    load_s = time.perf_counter() - t0
    ceilings = measure_ceilings(device, plan.dtype)  # the matmul rate of the dtype that runs
    weight_bytes = _weight_bytes(ex)
    work = work_model(plan, weight_bytes)
    vocab = int(plan.model["vocab"])
    results = []
    try:
        t1 = time.perf_counter()
        for b in args.batch_sizes:  # warm-up: compile every kernel variant the loads use
            engine_load(engine, _prompts(b, args.input_len, vocab, args.seed + 1), 3)
        warm_s = time.perf_counter() - t1
        for b in args.batch_sizes:
            if hasattr(ex, "records"):
                ex.records.clear()
            timings = engine_load(
                engine, _prompts(b, args.input_len, vocab, args.seed), args.output_len
            )
            row: dict[str, Any] = {"batch": b, **summarise(timings)}
            row.update(limit_figures(row, work, ceilings, b, args.input_len, args.output_len))
            row.update(_step_stats(ex, b, row.get("decode_limit_tok_per_s")))
            results.append(row)
    finally:
        engine.close()
    if hf is not None:
        _run_peer(hf, results, args, vocab, ceilings, work)
    return {
        "mode": "engine",
        "model": plan.name,
        "architecture": plan.architecture,
        "weights": args.weights if args.synthetic else "artifact",
        "device": ceilings.device,
        "dtype": plan.dtype,
        "kv_dtype": plan.kv.dtype,
        "cuda_graphs": bool(plan.cuda_graph_buckets),
        "overlap": not args.no_overlap and bool(getattr(ex, "feeds_tokens", False)),
        "tensor_parallel": args.tensor_parallel,  # weight_bytes and limits: per rank
        "fusions": {k: v for k, v in plan.fusions.items() if v},
        "input_len": args.input_len,
        "output_len": args.output_len,
        "weight_bytes": sum(weight_bytes.values()),
        "copy_gb_per_s": ceilings.copy_bytes_per_s / 1e9,
        "matmul_tflops": ceilings.matmul_flops_per_s / 1e12,
        "matmul_dtype": ceilings.matmul_dtype,
        "load_s": load_s,
        "warmup_s": warm_s,
        "results": results,
    }


def _weight_bytes(ex: Any) -> dict[str, int]:
    from ninfer.runtime.executors.cuda.weights import weight_read_bytes

    return {n: weight_read_bytes(w) for n, w in ex.weights.items()}


def _run_peer(
    hf: Any,
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    vocab: int,
    ceilings: Any,
    work: Any,
) -> None:
    from ninfer.bench.loadgen import summarise
    from ninfer.bench.peer import peer_load

    for row in results:
        b = row["batch"]
        peer_load(hf, _prompts(b, args.input_len, vocab, args.seed + 1), 3)  # warm-up
        peer = summarise(
            peer_load(hf, _prompts(b, args.input_len, vocab, args.seed), args.output_len)
        )
        tpot = peer["tpot_ms"]["p50"]
        peer["decode_tok_per_s"] = b / (tpot / 1e3) if tpot else None
        row["peer"] = {"name": args.peer, **peer}
        mine, theirs = row.get("output_tok_per_s"), peer.get("output_tok_per_s")
        row["vs_peer_output_tok_per_s"] = mine / theirs if mine and theirs else None
        if row.get("decode_tok_per_s") and peer["decode_tok_per_s"]:
            row["vs_peer_decode"] = row["decode_tok_per_s"] / peer["decode_tok_per_s"]

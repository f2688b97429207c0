"""`ninfer compile ARTIFACT [--device cpu|cuda] [engine options] [--verbose] [--json]`: print
the plan: a summary (options, passes, fusions, KV layout, memory ledger, CUDA Graph buckets,
kernels and their launches); `--verbose` adds every weight and call, identical layers folded.

Compiling does not run anything, so `--device cuda` works on a machine without a GPU: the plan
says which kernels it would use, how the KV cache is laid out and how memory is spent.
Impossible options (capacity beyond memory, max-concurrency outside 1..8, unknown KV dtype,
a --tensor-parallel N that does not divide the heads) fail with a one-line ConfigError.
`--tensor-parallel N` prints the plan of every rank (`== rank r of N ==` before each; with
`--json` a list): its part of the weights, the KV pool and ledger per rank, the collectives.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from ninfer.artifact import Artifact
from ninfer.errors import ConfigError
from ninfer.ir.kv_formats import KV_DTYPES
from ninfer.passes.options import CPU_WEIGHTS, DEVICES, CompileOptions, parse_kv_capacity


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help=".ninfer file")
    p.add_argument(
        "--device", default="cpu", help=f"target device: {' | '.join(DEVICES)} (default cpu)"
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="compute dtype: float32 | bfloat16 (default: float32 on cpu, bfloat16 on cuda)",
    )
    p.add_argument("--kv-dtype", default=None, help=f"KV cache storage: {' | '.join(KV_DTYPES)}")
    p.add_argument("--max-concurrency", type=int, default=1, help="decode lanes, 1..8 (default 1)")
    p.add_argument(
        "--max-context", type=int, default=8192, help="tokens per sequence (default 8192)"
    )
    p.add_argument(
        "--kv-capacity", default=None, help="KV pool tokens: N | auto (default: --max-context)"
    )
    p.add_argument(
        "--prefill-chunk", type=int, default=1024, help="prefill tokens per step (default 1024)"
    )
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default 16)")
    p.add_argument(
        "--device-state-slots",
        type=int,
        default=None,
        help="extra recurrent-state slots (default: max-concurrency)",
    )
    p.add_argument("--no-cuda-graph", action="store_true", help="no CUDA Graph decode buckets")
    p.add_argument(
        "--cpu-weights",
        choices=CPU_WEIGHTS,
        default=None,
        help="cpu plans: GGUF weights packed (read by the cpu.* kernels) or float32 (default:"
        " float32 when --dtype float32 is given, else packed)",
    )
    p.add_argument(
        "--memory-gib",
        type=float,
        default=None,
        help="memory the plan may use (default: 139 on cuda, 16 on cpu)",
    )
    p.add_argument(
        "--vision",
        action="store_true",
        help="include the vision tower (needs the artifact's vision component)",
    )
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="shard over N ranks and print every rank's plan and its collectives (default 1)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="also print every weight and call (rows of identical layers folded)",
    )
    p.add_argument(
        "--spec",
        choices=("mtp", "dflash"),
        help="mtp: the target plan captures the hidden states the MTP head reads, and the "
        "head's own plan (the drafter stage, its own KV pages) is printed after it; dflash: "
        "the target plan captures the DFlash drafter's target layers, and the drafter's shape "
        "is printed after it",
    )
    p.add_argument(
        "--lm-head-draft",
        action="store_true",
        help="with --spec mtp: the head's plan without its full logits (the drafter applies "
        "the reduced, frequency-ranked head); with --spec dflash: the drafter's reduced head",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def options_from_args(args: argparse.Namespace) -> CompileOptions:
    return CompileOptions(
        device=args.device,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        max_concurrency=args.max_concurrency,
        max_context=args.max_context,
        kv_capacity=parse_kv_capacity(args.kv_capacity),
        prefill_chunk=args.prefill_chunk,
        page_size=args.page_size,
        device_state_slots=args.device_state_slots,
        cuda_graphs=not args.no_cuda_graph,
        cpu_weights=args.cpu_weights,
        device_memory=_memory_bytes(args.memory_gib),
        vision=args.vision,
        tensor_parallel=args.tensor_parallel,
        capture=("final",) if getattr(args, "spec", None) == "mtp" else (),
    )


def _memory_bytes(gib: float | None) -> int | None:
    """--memory-gib as bytes; a ConfigError naming the flag when it is not positive."""
    if gib is None:
        return None
    if not math.isfinite(gib) or gib <= 0:
        raise ConfigError(f"--memory-gib must be a positive number of GiB, got {gib:g}")
    return int(gib * (1 << 30))


def run(args: argparse.Namespace) -> int:
    from ninfer.passes.pipeline import compile_artifact, compile_ranks

    options = options_from_args(args)
    artifact = Artifact(args.artifact)
    if options.tensor_parallel > 1:  # every rank's plan, rank 0 first
        plans = compile_ranks(artifact, options)
        if args.json:
            print(json.dumps([p.to_dict() for p in plans], indent=2))
        else:
            for p in plans:
                print(f"== rank {p.parallel.rank} of {p.parallel.world} ==")  # type: ignore[union-attr]
                print(p.to_text(verbose=args.verbose), end="")
        return 0
    if args.lm_head_draft and args.spec is None:
        raise ConfigError("--lm-head-draft requires --spec mtp or dflash")
    drafter = None
    if args.spec == "dflash":  # the target layers the drafter reads are captured
        from ninfer.artifact.dflash import describe, dflash_config

        if "dflash" not in artifact.components:
            raise ConfigError(
                f"--spec dflash needs the artifact's dflash component, but it has only"
                f" {', '.join(artifact.components)}"
            )
        cfg = dflash_config(artifact)
        extra = tuple(c for c in cfg.capture if c not in options.capture)
        options = dataclasses.replace(options, capture=options.capture + extra)
        drafter = describe(cfg)
        if args.lm_head_draft:  # the drafter's logits over the reduced head (draft_vocab.py)
            from ninfer.spec.draft_vocab import draft_size

            drafter["draft_head"] = f"{draft_size(cfg.spec.vocab)} rows, frequency-ranked"
    plan = compile_artifact(artifact, options)
    head = None
    if args.spec == "mtp":  # the drafter's stage: the artifact's MTP head, its own plan
        from ninfer.passes.pipeline import compile_mtp

        head = compile_mtp(artifact, options, logits=not args.lm_head_draft)
    if args.json:
        data = plan.to_dict()
        if drafter is not None:
            data = {"plan": data, "dflash": drafter}
        print(json.dumps(data if head is None else {"plan": data, "mtp": head.to_dict()}, indent=2))
    else:
        print(plan.to_text(verbose=args.verbose), end="")
        if head is not None:
            print("== mtp (--spec mtp drafter stage) ==")
            print(head.to_text(verbose=args.verbose), end="")
        if drafter is not None:
            print("== dflash (--spec dflash drafter stage: one block forward per round) ==")
            for k, v in drafter.items():
                print(f"{k:<18}{v}")
    return 0

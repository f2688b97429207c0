# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""Micro-benchmark of the weight-only quantised GEMV/GEMM (kernels/quant_gemm.py) on CUDA.

    python -m bench.gemv_bench [--out DIR] [--write-table] [--quick]

Per projection shape (N, K) it times, with CUDA-graph replay (triton.testing.do_bench_cudagraph,
so launch overhead is excluded as in the engine's graph-captured decode):

- M = 1: torch bf16 ``F.linear`` (cuBLAS), and fp8 / nvfp4 ``quant_linear`` with every GEMV
  launch shape of a small grid (rows per program x warps x prefetch), checking each result
  against the reference; the best is the shape's table entry (``--write-table`` stores the
  table in kernels/quant_gemm_table.json, which quant_gemv reads at import);
- M = 2..16: the GEMV path against the tensor-core (tiled) path and bf16;
- M = 64..4096: tiled against dense (dequantise once + cuBLAS) and bf16.

Rates are bytes moved / time against the copy bandwidth measured in the same run (bytes read +
written by a device-to-device copy), and for big M, FLOPs against bf16 matmul measured here.
Writes gemv_h200.json and gemv_h200.md to --out (default bench/results).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from bench.dense_gemv_bench import copy_bandwidth, sweep_arguments
from kernels.quant_gemm import (
    quant_linear,
    quant_linear_reference,
    quantize_weight_fp8,
    quantize_weight_nvfp4,
)
from kernels.quant_gemv import GEMV_TABLE_PATH, GemvConfig, gemv_config

# Qwen3-8B: qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288;
# Llama-3-8B / Qwen3-32B-like: 28672x4096 (gate_up), 4096x14336 (down); 8192x8192 square
SHAPES = [
    (6144, 4096),
    (4096, 4096),
    (24576, 4096),
    (4096, 12288),
    (8192, 8192),
    (28672, 4096),
    (4096, 14336),
    (12288, 4096),
]
SWEEP = [
    GemvConfig(bn, warps, prefetch)
    for bn in (4, 8, 16)
    for warps in (4, 8)
    for prefetch in (False, True)
]


def _time(fn) -> float:
    """Median ms of fn under CUDA-graph replay."""
    return float(do_bench_cudagraph(fn, rep=30))


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = _time(lambda: a @ a)
    return 2 * 8192**3 / (t * 1e-3)


def _weights(N: int, K: int):
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    q8, s8 = quantize_weight_fp8(w)
    q4, s4, g4 = quantize_weight_nvfp4(w)
    return w, {"fp8": (q8, s8, 1.0), "nvfp4": (q4, s4, g4)}


def _nbytes(fmt: str, N: int, K: int, M: int) -> int:
    wbytes = {"bf16": 2 * N * K, "fp8": N * K + 4 * N, "nvfp4": N * K // 2 + N * K // 16}[fmt]
    return wbytes + 2 * M * K + 2 * M * N


def _check(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Max error relative to the reference's max magnitude."""
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-6))


def bench_m1(bw: float, quick: bool) -> tuple[list[dict], dict[str, list]]:
    rows, table = [], {}
    for N, K in SHAPES[:3] if quick else SHAPES:
        w, quant = _weights(N, K)
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        t_bf = _time(lambda: F.linear(x, w))
        row = {
            "N": N,
            "K": K,
            "bf16_ms": t_bf,
            "bf16_bw": _nbytes("bf16", N, K, 1) / (t_bf * 1e-3) / bw,
        }
        for fmt, (q, s, g) in quant.items():
            ref = quant_linear_reference(x, q, s, fmt, g)
            default = gemv_config(fmt, N, K, x.device)
            results = []
            for cfg in SWEEP if not quick else [default]:
                y = quant_linear(x, q, s, fmt, g, path="gemv", config=cfg)
                err = _check(y, ref)
                t = _time(lambda: quant_linear(x, q, s, fmt, g, path="gemv", config=cfg))
                results.append((t, cfg, err))
            t_def = _time(lambda: quant_linear(x, q, s, fmt, g))
            best_t, best, _best_err = min(results, key=lambda r: r[0])
            worst_err = max(r[2] for r in results)
            row[fmt] = {
                "default_ms": t_def,
                "best_ms": best_t,
                "best": [best.bn, best.warps, best.prefetch],
                "best_bw": _nbytes(fmt, N, K, 1) / (best_t * 1e-3) / bw,
                "default_bw": _nbytes(fmt, N, K, 1) / (t_def * 1e-3) / bw,
                "vs_bf16": t_bf / best_t,
                "max_rel_err": worst_err,
                "sweep": [[c.bn, c.warps, c.prefetch, t] for t, c, _ in results],
            }
            table[f"{fmt}:{N}:{K}"] = [best.bn, best.warps, best.prefetch]
            print(
                f"M=1 N={N} K={K} {fmt}: best {best_t * 1e3:.1f} us {best} "
                f"({row[fmt]['best_bw']:.0%} of copy bw, {t_bf / best_t:.2f}x bf16 "
                f"{t_bf * 1e3:.1f} us), default {t_def * 1e3:.1f} us, err {worst_err:.1e}",
                flush=True,
            )
        rows.append(row)
    return rows, table


def bench_batches(bw: float, flops: float, quick: bool) -> list[dict]:
    out = []
    for N, K in [(8192, 8192)] if quick else [(8192, 8192), (24576, 4096)]:
        w, quant = _weights(N, K)
        for M in (2, 4, 8, 16, 64, 256, 1024, 4096):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            t_bf = _time(lambda: F.linear(x, w))
            row = {"N": N, "K": K, "M": M, "bf16_ms": t_bf}
            for fmt, (q, s, g) in quant.items():
                paths = ["gemv", "tiled"] if M <= 16 else ["tiled", "dense"]
                ref = quant_linear_reference(x, q, s, fmt, g)
                for p in paths:
                    y = quant_linear(x, q, s, fmt, g, path=p)
                    t = _time(lambda: quant_linear(x, q, s, fmt, g, path=p))
                    row[f"{fmt}_{p}_ms"] = t
                    row[f"{fmt}_{p}_err"] = _check(y, ref)
                    row[f"{fmt}_{p}_bw"] = _nbytes(fmt, N, K, M) / (t * 1e-3) / bw
                    row[f"{fmt}_{p}_mm"] = 2 * M * N * K / (t * 1e-3) / flops
            out.append(row)
            print(
                f"M={M} N={N} K={K}: bf16 {t_bf * 1e3:.1f} us | "
                + " | ".join(
                    f"{k[:-3]} {v * 1e3:.1f} us"
                    for k, v in row.items()
                    if k.endswith("_ms") and k != "bf16_ms"
                ),
                flush=True,
            )
    return out


def write_md(
    path: Path,
    dev: str,
    bw: float,
    flops: float,
    m1: list[dict],
    batches: list[dict],
    note: str = "",
) -> None:
    lines = [
        "`python -m bench.gemv_bench` (kernels/quant_gemm.py), CUDA-graph replay, medians",
        "",
        (
            f"device {dev}; copy bandwidth {bw / 1e9:.0f} GB/s (read+write), bf16 matmul "
            f"{flops / 1e12:.0f} TFLOP/s. 'bw' = bytes moved (weights, scales, x, y) / time / copy "
            "bandwidth. Graph replay does not flush the 60 MB L2 between calls, so weights that fit "
            "in it (below ~50 MB) read partly from L2: trust the big shapes and the engine figures."
        ),
        "",
        note,
        "",
        "## M = 1 (decode GEMV): best launch shape of the sweep [rows/program, warps, prefetch]",
        "",
        "| N | K | bf16 us (bw) | fp8 us (bw) | fp8 / bf16 speed | nvfp4 us (bw) | nvfp4 / bf16 speed | fp8 best | nvfp4 best |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in m1:
        f8, f4 = r["fp8"], r["nvfp4"]
        lines.append(
            f"| {r['N']} | {r['K']} | {r['bf16_ms'] * 1e3:.1f} ({r['bf16_bw']:.0%}) | "
            f"{f8['best_ms'] * 1e3:.1f} ({f8['best_bw']:.0%}) | {f8['vs_bf16']:.2f}x | "
            f"{f4['best_ms'] * 1e3:.1f} ({f4['best_bw']:.0%}) | {f4['vs_bf16']:.2f}x | "
            f"{f8['best']} | {f4['best']} |"
        )
    lines += [
        "",
        (
            "## Batches: time in us per path (gemv = CUDA-core GEMV, tiled = tensor-core tiles, "
            "dense = dequantise once + cuBLAS)"
        ),
        "",
        "| N | K | M | bf16 | fp8 paths | nvfp4 paths |",
        "|---|---|---|---|---|---|",
    ]
    for r in batches:
        cells = []
        for fmt in ("fp8", "nvfp4"):
            cells.append(
                ", ".join(
                    f"{k[len(fmt) + 1 : -3]} {v * 1e3:.1f}"
                    for k, v in r.items()
                    if k.startswith(fmt) and k.endswith("_ms")
                )
            )
        lines.append(
            f"| {r['N']} | {r['K']} | {r['M']} | {r['bf16_ms'] * 1e3:.1f} | {cells[0]} | {cells[1]} |"
        )
    path.write_text("\n".join(lines) + "\n")


def rerender(path: Path, bw: float | None) -> None:
    """Recompute the bandwidth ratios of a saved report (e.g. against the copy bandwidth that
    `ninfer bench engine` measured on the same machine) and rewrite both files."""
    report = json.loads(path.read_text())
    old, bw = report["copy_bw"], bw or report["copy_bw"]
    for r in report["m1"]:
        r["bf16_bw"] *= old / bw
        for fmt in ("fp8", "nvfp4"):
            r[fmt]["best_bw"] *= old / bw
            r[fmt]["default_bw"] *= old / bw
    for r in report["batches"]:
        for k in list(r):
            if k.endswith("_bw"):
                r[k] *= old / bw
    report["copy_bw"] = bw
    path.write_text(json.dumps(report, indent=1))
    note = (
        f"Ratios re-rendered against a copy bandwidth of {bw / 1e9:.0f} GB/s (this run measured "
        f"{old / 1e9:.0f} GB/s)."
        if bw != old
        else ""
    )
    write_md(
        path.with_suffix(".md"),
        report["device"],
        bw,
        report["matmul"],
        report["m1"],
        report["batches"],
        note,
    )


def main() -> None:
    ap = sweep_arguments()
    ap.add_argument("--rerender", help="rewrite the Markdown of a saved JSON report")
    ap.add_argument("--copy-bw", type=float, help="with --rerender: copy bandwidth, bytes/s")
    args = ap.parse_args()
    if args.rerender:
        rerender(Path(args.rerender), args.copy_bw)
        return
    t0 = time.time()
    bw, flops = copy_bandwidth(), matmul_rate()
    print(f"copy {bw / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s", flush=True)
    m1, table = bench_m1(bw, args.quick)
    if args.write_table:
        GEMV_TABLE_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    batches = bench_batches(bw, flops, args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "device": torch.cuda.get_device_name(),
        "copy_bw": bw,
        "matmul": flops,
        "m1": m1,
        "batches": batches,
        "table": table,
        "seconds": time.time() - t0,
    }
    (out / "gemv_h200.json").write_text(json.dumps(report, indent=1))
    write_md(out / "gemv_h200.md", report["device"], bw, flops, m1, batches)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

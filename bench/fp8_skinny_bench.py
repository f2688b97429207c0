# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""5..16-row products against fp8 weights on CUDA: kernels/fp8_skinny.py's tiles against the
bf16 tiles of the same shape and quant_linear's fp8 tiles.

    python -m bench.fp8_skinny_bench [--out DIR] [--write-table] [--quick]

Per weight shape of the DFlash drafter (Qwen3-8B width: fused q/k/v, o, fused gate/up, down)
and the reduced draft head (32768 rows), at M = 8 and 16, under CUDA-graph replay, with every
call reading a weight not in L2 (copies cycled past 400 MB, as bench/dense_gemv_bench.py):
every launch shape of FP8_SWEEP (shapes the shared memory cannot hold are skipped), the bf16
skinny tiles the dense sweep chose for that shape (ninfer/passes/gemm_launch.py) and
quant_linear's fp8 tiles. Writes fp8_skinny_h200.{json,md} to --out; --write-table stores
kernels/fp8_skinny_table.json: the best shape per (N, K, M) where it beat quant_linear.
"""

from __future__ import annotations

import time

import torch
import triton

from bench.dense_gemv_bench import ROTATE_BYTES, _per_call, _save, copy_bandwidth, sweep_arguments
from kernels.fp8_skinny import TABLE_PATH, Fp8SkinnyConfig, fp8_skinny, fp8_skinny_reference
from kernels.quant_gemm import quant_linear, quantize_weight_fp8
from ninfer.spec.gemm import dense_gemm

SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (32768, 4096)]
FP8_SWEEP = [
    Fp8SkinnyConfig(bn, bk, stages, warps)
    for bn in (16, 32, 64, 128)
    for bk in (128, 256, 512)
    for stages in (3, 4, 6)
    for warps in (4, 8)
]


def bench_shape(N: int, K: int, bw: float, quick: bool) -> dict:
    copies = max(1, -(-ROTATE_BYTES // (N * K)))
    dense = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
    qs = [quantize_weight_fp8(w) for w in dense]
    dense = dense[: max(1, -(-ROTATE_BYTES // (2 * N * K)))]
    row: dict = {"N": N, "K": K, "wins": {}}
    for M in (8, 16):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        mm = dense_gemm(N, K, M)
        t_bf = _per_call(lambda i: mm(x, dense[i]), len(dense))
        t_ql = _per_call(lambda i: quant_linear(x, *qs[i], "fp8", path="tiled"), copies)
        ref = fp8_skinny_reference(x, *qs[0]).float()
        sweep = []
        for cfg in FP8_SWEEP[::12] if quick else FP8_SWEEP:
            try:
                y = fp8_skinny(x, *qs[0], cfg).float()
            except triton.runtime.errors.OutOfResources as e:  # shared memory of this tile
                print(f"  skip {cfg}: {type(e).__name__}", flush=True)
                continue
            assert float((y - ref).abs().max() / ref.abs().max()) < 2e-2, (N, K, M, cfg)
            sweep.append((_per_call(lambda i: fp8_skinny(x, *qs[i], cfg), copies), cfg))
        t, c = min(sweep, key=lambda r: r[0])
        best = [c.bn, c.bk, c.stages, c.warps]
        row[f"m{M}"] = {
            "bf16_ms": t_bf, "quant_linear_ms": t_ql, "best_ms": t, "best": best,
            "bf16_bw": 2 * N * K / (t_bf * 1e-3) / bw, "best_bw": N * K / (t * 1e-3) / bw,
        }  # fmt: skip
        if t < t_ql:
            row["wins"][str(M)] = best
        print(
            f"N={N} K={K} M={M}: bf16 tiles {t_bf * 1e3:.1f} us, quant_linear fp8"
            f" {t_ql * 1e3:.1f} us, fp8 tiles {t * 1e3:.1f} us {best}",
            flush=True,
        )
    return row


def main() -> None:
    args = sweep_arguments().parse_args()
    t0 = time.time()
    bw = copy_bandwidth()
    print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for N, K in SHAPES[:2] if args.quick else SHAPES:
        rows.append(bench_shape(N, K, bw, args.quick))
        torch.cuda.empty_cache()
    table = {f"{r['N']}:{r['K']}": r["wins"] for r in rows}
    out, dev = _save(args, TABLE_PATH, "fp8_skinny_h200.json", bw, rows, table, t0)
    lines = [
        (
            "`python -m bench.fp8_skinny_bench` (kernels/fp8_skinny.py against the bf16 tiles and "
            f"quant_linear's fp8 tiles), {dev}, weights cycled past L2, us per call (share of copy"
            f" bandwidth {bw / 1e9:.0f} GB/s)"
        ),
        "",
        "| N | K | M | bf16 tiles | quant_linear fp8 | fp8 tiles | best [rows, K tile, stages, warps] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for M in (8, 16):
            c = r[f"m{M}"]
            lines.append(
                f"| {r['N']} | {r['K']} | {M} | {c['bf16_ms'] * 1e3:.1f} ({c['bf16_bw']:.0%}) | "
                f"{c['quant_linear_ms'] * 1e3:.1f} | {c['best_ms'] * 1e3:.1f} ({c['best_bw']:.0%}) |"
                f" {c['best']} |"
            )
    (out / "fp8_skinny_h200.md").write_text("\n".join(lines) + "\n")
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

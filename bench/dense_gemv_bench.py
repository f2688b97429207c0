# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""Decode GEMV of dense bf16 weights on CUDA: kernels/gemv.py against cuBLAS (F.linear).

    python -m bench.dense_gemv_bench [--out DIR] [--write-table] [--quick]

Per projection shape of the models we benchmark (Qwen3-8B, Qwen3.5-9B hybrid, their LM heads)
it times, under CUDA-graph replay, cuBLAS and every launch shape of a small grid (rows per
program x warps x chunks loaded ahead) at M = 1, then the three best shapes and cuBLAS at
M = 2 and 4. GLU rows time silu(gate) * up folded into the kernel against the silu_mul kernel +
cuBLAS it replaces.

Unlike bench/gemv_bench.py, each timed call cycles through enough copies of the weight (over
400 MB) that no call finds its weight in the 60 MB L2, as in the engine, where each layer's
weights are read once per step. Writes dense_gemv_h200.{json,md} to --out; --write-table stores
kernels/gemv_table.json: per weight, the best shape at each M (1, 2, 4) where the kernel beat
cuBLAS (an empty entry: cuBLAS won at every M).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph

from kernels.gemv import (
    SKINNY_TABLE_PATH,
    TABLE_PATH,
    DenseGemvConfig,
    SkinnyConfig,
    dense_gemv,
    dense_gemv_reference,
    dense_skinny,
)
from kernels.silu_mul import silu_mul

# (N, K, glu): Qwen3-8B qkv, o, gate_up, down (+ SwiGLU), LM head; Qwen3.5-9B hybrid DeltaNet
# in-projection (qkv+z+b+a), gated-attention qkv, LM head
SHAPES = [
    (6144, 4096, False),
    (4096, 4096, False),
    (24576, 4096, False),
    (4096, 12288, False),
    (4096, 12288, True),
    (151936, 4096, False),
    (12352, 4096, False),
    (10240, 4096, False),
    (248320, 4096, False),
]
SWEEP = [
    DenseGemvConfig(bn, warps, unroll)
    for bn in (1, 2, 4, 8)
    for warps in (4, 8)
    for unroll in (1, 2, 4)
]
SKINNY_SWEEP = [
    SkinnyConfig(bn, bk, stages) for bn in (16, 32, 64) for bk in (128, 256) for stages in (3, 5)
]
ROTATE_BYTES = 400 * 2**20


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (plain launches: under
    graph replay this copy read 2.8 TB/s on the H200, against 4.28 TB/s measured this way by
    `ninfer bench engine`)."""
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = float(do_bench(lambda: b.copy_(a), rep=50))
    return 2 * a.numel() / (t * 1e-3)


def _per_call(fn, copies: int, rep: int = 40) -> float:
    """Median ms of one call of fn(i), i cycling over the copies, under graph replay."""

    def run():
        for i in range(copies):
            fn(i)

    return float(do_bench_cudagraph(run, rep=rep)) / copies


def bench_shape(N: int, K: int, glu: bool, bw: float, quick: bool) -> dict:
    wbytes = 2 * N * K
    copies = max(1, -(-ROTATE_BYTES // wbytes))
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
    xk = 2 * K if glu else K
    row: dict = {"N": N, "K": K, "glu": glu, "copies": copies}

    def rate(ms: float, M: int) -> float:
        return (wbytes + 2 * M * (xk + N)) / (ms * 1e-3) / bw

    def cublas(M: int, x: torch.Tensor) -> float:
        if glu:
            return _per_call(lambda i: F.linear(silu_mul(x), ws[i]), copies)
        return _per_call(lambda i: F.linear(x, ws[i]), copies)

    x1 = torch.randn(1, xk, device="cuda", dtype=torch.bfloat16)
    t_cb = cublas(1, x1)
    ref = dense_gemv_reference(x1, ws[0], glu=glu).float()
    sweep = []
    for cfg in SWEEP[:4] if quick else SWEEP:
        y = dense_gemv(x1, ws[0], cfg, glu=glu).float()
        err = float((y - ref).abs().max() / ref.abs().max())
        assert err < 2e-2, (N, K, glu, cfg, err)
        t = _per_call(lambda i: dense_gemv(x1, ws[i], cfg, glu=glu), copies)
        sweep.append((t, cfg))
    sweep.sort(key=lambda r: r[0])
    best_t, best = sweep[0]
    row.update(
        cublas_ms=t_cb, cublas_bw=rate(t_cb, 1), best_ms=best_t, best_bw=rate(best_t, 1),
        best=[best.bn, best.warps, best.unroll],
        sweep=[[c.bn, c.warps, c.unroll, t] for t, c in sweep],
    )  # fmt: skip
    print(
        f"N={N} K={K} glu={glu}: cuBLAS {t_cb * 1e3:.1f} us ({rate(t_cb, 1):.0%}), "
        f"gemv {best_t * 1e3:.1f} us ({rate(best_t, 1):.0%}) {row['best']}",
        flush=True,
    )
    row["wins"] = {"1": row["best"]} if best_t < t_cb else {}
    for M in (2, 4):
        xm = torch.randn(M, xk, device="cuda", dtype=torch.bfloat16)
        t_cbm = cublas(M, xm)
        tops = [
            (_per_call(lambda i: dense_gemv(xm, ws[i], c, glu=glu), copies), c)
            for _, c in sweep[:3]
        ]
        t_m, c_m = min(tops, key=lambda r: r[0])
        row[f"m{M}"] = {"cublas_ms": t_cbm, "best_ms": t_m, "best": [c_m.bn, c_m.warps, c_m.unroll]}
        print(
            f"  M={M}: cuBLAS {t_cbm * 1e3:.1f} us, gemv {t_m * 1e3:.1f} us {row[f'm{M}']['best']}",
            flush=True,
        )
        if t_m < t_cbm:
            row["wins"][str(M)] = row[f"m{M}"]["best"]
    return row


def bench_skinny(N: int, K: int, bw: float) -> dict:
    """M = 8 and 16: cuBLAS against every tile shape of SKINNY_SWEEP (shapes that do not fit
    the shared memory are skipped)."""
    wbytes = 2 * N * K
    copies = max(1, -(-ROTATE_BYTES // wbytes))
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
    row: dict = {"N": N, "K": K, "wins": {}}
    for M in (8, 16):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        t_cb = _per_call(lambda i: F.linear(x, ws[i]), copies)
        ref = dense_gemv_reference(x, ws[0]).float()
        sweep = []
        for cfg in SKINNY_SWEEP:
            try:
                y = dense_skinny(x, ws[0], cfg).float()
            except triton.runtime.errors.OutOfResources as e:  # shared memory of this tile
                print(f"  skip {cfg}: {type(e).__name__}", flush=True)
                continue
            assert float((y - ref).abs().max() / ref.abs().max()) < 2e-2, (N, K, M, cfg)
            sweep.append((_per_call(lambda i: dense_skinny(x, ws[i], cfg), copies), cfg))
        t, c = min(sweep, key=lambda r: r[0])
        best = [c.bn, c.bk, c.stages, c.warps]
        row[f"m{M}"] = {"cublas_ms": t_cb, "best_ms": t, "best": best,
                        "cublas_bw": wbytes / (t_cb * 1e-3) / bw, "best_bw": wbytes / (t * 1e-3) / bw}  # fmt: skip
        if t < t_cb:
            row["wins"][str(M)] = best
        print(
            f"N={N} K={K} M={M}: cuBLAS {t_cb * 1e3:.1f} us, tiles {t * 1e3:.1f} us {best}",
            flush=True,
        )
    return row


def write_report(
    path: Path, intro: str, dev: str, bw: float, rates: str, header: str, table: list[str]
) -> None:
    """A sweep's Markdown report: how it was run (`intro`), the device and its copy bandwidth
    followed by what the rates mean (`rates`), then the table: `header` (a Markdown row) and
    one line per shape."""
    lines = [intro, "", f"device {dev}; copy bandwidth {bw / 1e9:.0f} GB/s (read+write){rates}"]
    lines += ["", header, "|" + "---|" * (header.count("|") - 1), *table]
    path.write_text("\n".join(lines) + "\n")


def write_md(path: Path, dev: str, bw: float, rows: list[dict]) -> None:
    table = [
        f"| {r['N']} | {r['K']} | {'yes' if r['glu'] else 'no'} | {r['cublas_ms'] * 1e3:.1f} ({r['cublas_bw']:.0%}) | "
        f"{r['best_ms'] * 1e3:.1f} ({r['best_bw']:.0%}) | {r['best']} | "
        f"{r['m2']['cublas_ms'] * 1e3:.1f} / {r['m2']['best_ms'] * 1e3:.1f} | {r['m4']['cublas_ms'] * 1e3:.1f} / {r['m4']['best_ms'] * 1e3:.1f} |"
        for r in rows
    ]
    write_report(
        path,
        "`python -m bench.dense_gemv_bench` (kernels/gemv.py against cuBLAS), CUDA-graph replay, medians",
        dev,
        bw,
        ". 'bw' = bytes moved / time / copy bandwidth; every call reads a weight not in L2 (copies "
        "cycled, > 400 MB). GLU rows: silu_mul kernel + cuBLAS against the kernel with the SwiGLU "
        "folded in.",
        "| N | K | GLU | cuBLAS us (bw) | gemv us (bw) | best [rows, warps, unroll] | M=2 cuBLAS / gemv us | M=4 cuBLAS / gemv us |",
        table,
    )


def sweep_arguments() -> argparse.ArgumentParser:
    """The options every launch-table sweep takes: --out DIR, --write-table, --quick."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--write-table", action="store_true")
    ap.add_argument("--quick", action="store_true")
    return ap


def sweep_shapes(
    args: argparse.Namespace, bench: Any, shapes: list, table_path: Path, name: str, md: Any
) -> None:
    """bench(N, K, glu, bw, quick) -> row for every shape (two with --quick), then the table of
    the rows' "wins" (with --write-table) and the reports <name>.json / .md in --out."""
    t0 = time.time()
    bw = copy_bandwidth()
    print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for N, K, glu in shapes[:2] if args.quick else shapes:
        rows.append(bench(N, K, glu, bw, args.quick))
        torch.cuda.empty_cache()
    table = {f"{r['N']}:{r['K']}:{int(r['glu'])}": r["wins"] for r in rows}
    out, dev = _save(args, table_path, f"{name}.json", bw, rows, table, t0)
    md(out / f"{name}.md", dev, bw, rows)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


def main() -> None:
    ap = sweep_arguments()
    ap.add_argument("--skinny", action="store_true", help="only the M = 8 / 16 tensor-core tiles")
    args = ap.parse_args()
    if args.skinny:
        t0 = time.time()
        bw = copy_bandwidth()
        print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
        main_skinny(args, bw, t0)
        return
    sweep_shapes(args, bench_shape, SHAPES, TABLE_PATH, "dense_gemv_h200", write_md)


def _save(args, table_path: Path, name: str, bw: float, rows, table, t0: float) -> tuple[Path, str]:
    """Write the table (with --write-table) and the JSON report; (output folder, device)."""
    if args.write_table:
        table_path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name()
    report = {
        "device": dev,
        "copy_bw": bw,
        "rows": rows,
        "table": table,
        "seconds": time.time() - t0,
    }
    (out / name).write_text(json.dumps(report, indent=1))
    return out, dev


def main_skinny(args: argparse.Namespace, bw: float, t0: float) -> None:
    rows = []
    for N, K, glu in SHAPES:
        if not glu:
            rows.append(bench_skinny(N, K, bw))
            torch.cuda.empty_cache()
    table = {f"{r['N']}:{r['K']}": r["wins"] for r in rows}
    out, dev = _save(args, SKINNY_TABLE_PATH, "skinny_h200.json", bw, rows, table, t0)
    lines = [
        (
            "`python -m bench.dense_gemv_bench --skinny` (kernels/gemv.py tensor-core tiles "
            f"against cuBLAS), {dev}, weights cycled past L2, us per call (share of copy "
            f"bandwidth {bw / 1e9:.0f} GB/s)"
        ),
        "",
        "| N | K | M | cuBLAS | tiles | best [rows, K tile, stages, warps] |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for M in (8, 16):
            c = r[f"m{M}"]
            lines.append(
                f"| {r['N']} | {r['K']} | {M} | {c['cublas_ms'] * 1e3:.1f} ({c['cublas_bw']:.0%}) | "
                f"{c['best_ms'] * 1e3:.1f} ({c['best_bw']:.0%}) | {c['best']} |"
            )
    (out / "skinny_h200.md").write_text("\n".join(lines) + "\n")
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

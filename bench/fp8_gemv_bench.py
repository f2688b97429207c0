"""Decode GEMV of fp8 weights on CUDA: kernels/fp8_gemv.py against quant_linear's older paths.

    python -m bench.fp8_gemv_bench [--out DIR] [--write-table] [--quick]
    python -m bench.fp8_gemv_bench --compile-only [--jobs N]     # no GPU needed

Per projection shape of bench/dense_gemv_bench.py (Qwen3-8B, Qwen3.5-9B; not the LM heads,
which stay bf16) it times, under CUDA-graph replay, the path quant_linear took before the fp8
GEMV (the quant_gemv kernel with its tuned table up to M = GEMV_MAX_M["fp8"], the tensor-core
tiles above; GLU rows: the silu_mul kernel first) and every launch shape of a small grid (rows
per program x warps x chunks loaded ahead) at M = 1, then the three best shapes (and the best
with one chunk in flight) against the older path at M = 2 and 4. As dense_gemv_bench does,
each timed call cycles through enough copies of the weight (over 400 MB) that none is read
from the 60 MB L2. Rates: weight + scale + x + y bytes / time, in GB/s and against the copy
bandwidth measured in the same run.

Writes fp8_gemv_h200.{json,md} to --out; --write-table stores kernels/fp8_gemv_table.json: per
weight, the best shape at each M (1, 2, 4) where the fp8 GEMV beat the older path (an empty
entry: it lost at every M, and quant_linear keeps the older path for that weight).

--compile-only compiles every kernel variant the sweep can launch (shape x GLU x rows of x per
program x even/ragged K) for sm_90 through triton.compile, on any machine, and prints registers,
stack (spills) and what the inner loop does (16-byte loads, shared-memory traffic).
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from triton.errors import TritonError

from bench.dense_gemv_bench import (
    ROTATE_BYTES,
    _per_call,
    sweep_arguments,
    sweep_shapes,
    write_report,
)
from bench.dense_gemv_bench import SHAPES as DENSE_SHAPES
from kernels.fp8_gemv import TABLE_PATH, Fp8GemvConfig, compile_fp8_gemv, fp8_gemv
from kernels.quant_gemm import GEMV_MAX_M, quant_linear, quant_linear_reference, quantize_weight_fp8

SHAPES = [s for s in DENSE_SHAPES if s[0] < 100_000]  # (N, K, glu) without the LM heads
SWEEP = [
    Fp8GemvConfig(bn, warps, unroll)
    for bn in (1, 2, 4, 8)
    for warps in (4, 8)
    for unroll in (1, 2, 4)
]
SWEEP_REP = 20  # ms of graph replay per timing in the M = 1 sweep (40 for the comparisons)


def older_path(M: int) -> str:
    """The quant_linear path an fp8 weight took at M rows before the fp8 GEMV."""
    return "gemv" if M <= GEMV_MAX_M["fp8"] else "tiled"


def rotating_fp8(N: int, K: int) -> tuple[int, list[torch.Tensor], list[torch.Tensor]]:
    """(weight + scale bytes, copies of one random fp8 weight and of its scales): enough copies
    (over ROTATE_BYTES) that a call cycling through them never reads its weight from L2."""
    wbytes = N * K + 4 * N
    copies = max(1, -(-ROTATE_BYTES // wbytes))
    q, s = quantize_weight_fp8(torch.randn(N, K, device="cuda") * 0.05)
    return (
        wbytes,
        [q] + [q.clone() for _ in range(copies - 1)],
        [s] + [s.clone() for _ in range(copies - 1)],
    )


def bench_shape(N: int, K: int, glu: bool, bw: float, quick: bool) -> dict:
    wbytes, qs, ss = rotating_fp8(N, K)
    q, s, copies = qs[0], ss[0], len(qs)
    xk = 2 * K if glu else K
    row: dict = {"N": N, "K": K, "glu": glu, "copies": copies}

    def rate(ms: float, M: int) -> tuple[float, float]:
        """(GB/s, share of the copy bandwidth)"""
        b = (wbytes + 2 * M * (xk + N)) / (ms * 1e-3)
        return b / 1e9, b / bw

    def older(x: torch.Tensor, M: int, rep: int = 40) -> float:
        path = older_path(M)
        return _per_call(
            lambda i: quant_linear(x, qs[i], ss[i], "fp8", path=path, glu=glu), copies, rep
        )

    def new(x: torch.Tensor, cfg: Fp8GemvConfig, rep: int = 40) -> float:
        return _per_call(lambda i: fp8_gemv(x, qs[i], ss[i], cfg, glu=glu), copies, rep)

    def check(x: torch.Tensor, cfg: Fp8GemvConfig) -> None:
        ref = quant_linear_reference(x, q, s, "fp8", glu=glu).float()
        err = float((fp8_gemv(x, q, s, cfg, glu=glu).float() - ref).abs().max() / ref.abs().max())
        assert err < 2e-2, (N, K, glu, x.shape[0], cfg, err)

    x1 = torch.randn(1, xk, device="cuda", dtype=torch.bfloat16)
    t_old = older(x1, 1)
    sweep = []
    for cfg in SWEEP[:4] if quick else SWEEP:
        check(x1, cfg)
        sweep.append((new(x1, cfg, SWEEP_REP), cfg))
    sweep.sort(key=lambda r: r[0])
    best_t, best = sweep[0]
    row["m1"] = {"older_path": older_path(1), "older_ms": t_old, "best_ms": best_t,
                 "best": [best.bn, best.warps, best.unroll],
                 "older_gbs": rate(t_old, 1)[0], "older_bw": rate(t_old, 1)[1],
                 "best_gbs": rate(best_t, 1)[0], "best_bw": rate(best_t, 1)[1]}  # fmt: skip
    row["sweep"] = [[c.bn, c.warps, c.unroll, t] for t, c in sweep]
    print(
        f"N={N} K={K} glu={glu}: older {t_old * 1e3:.1f} us ({rate(t_old, 1)[1]:.0%}), "
        f"fp8 gemv {best_t * 1e3:.1f} us ({rate(best_t, 1)[0]:.0f} GB/s, "
        f"{rate(best_t, 1)[1]:.0%}) {row['m1']['best']}",
        flush=True,
    )
    row["wins"] = {"1": row["m1"]["best"]} if best_t < t_old else {}
    tops = [c for _, c in sweep[:3]]
    tops += [c for _, c in sweep if c.unroll == 1 and c not in tops][:1]
    for M in (2, 4):
        xm = torch.randn(M, xk, device="cuda", dtype=torch.bfloat16)
        t_oldm = older(xm, M)
        timed = []
        for c in tops:
            check(xm, c)
            timed.append((new(xm, c), c))
        t_m, c_m = min(timed, key=lambda r: r[0])
        row[f"m{M}"] = {"older_path": older_path(M), "older_ms": t_oldm, "best_ms": t_m,
                        "best": [c_m.bn, c_m.warps, c_m.unroll],
                        "older_bw": rate(t_oldm, M)[1], "best_bw": rate(t_m, M)[1]}  # fmt: skip
        print(
            f"  M={M}: older ({older_path(M)}) {t_oldm * 1e3:.1f} us, "
            f"fp8 gemv {t_m * 1e3:.1f} us {row[f'm{M}']['best']}",
            flush=True,
        )
        if t_m < t_oldm:
            row["wins"][str(M)] = row[f"m{M}"]["best"]
    return row


def write_md(path: Path, dev: str, bw: float, rows: list[dict]) -> None:
    table = []
    for r in rows:
        m1, m2, m4 = r["m1"], r["m2"], r["m4"]
        table.append(
            f"| {r['N']} | {r['K']} | {'yes' if r['glu'] else 'no'} | "
            f"{m1['older_ms'] * 1e3:.1f} ({m1['older_gbs']:.0f}, {m1['older_bw']:.0%}) | "
            f"{m1['best_ms'] * 1e3:.1f} ({m1['best_gbs']:.0f}, {m1['best_bw']:.0%}) | {m1['best']} | "
            f"{m2['older_ms'] * 1e3:.1f} ({m2['older_path']}) / {m2['best_ms'] * 1e3:.1f} | "
            f"{m4['older_ms'] * 1e3:.1f} ({m4['older_path']}) / {m4['best_ms'] * 1e3:.1f} |"
        )
    write_report(
        path,
        "`python -m bench.fp8_gemv_bench` (kernels/fp8_gemv.py against quant_linear's older "
        "fp8 paths), CUDA-graph replay",
        dev,
        bw,
        ". Rates: weight + scale + x + y bytes / time (GB/s, share of the copy bandwidth); every "
        "call reads a weight not in L2 (copies cycled, > 400 MB). Older path: quant_gemv (gemv) "
        "or tensor-core tiles (tiled); GLU rows run silu_mul first there and fold it in here.",
        "| N | K | GLU | older us (GB/s, bw) | fp8 gemv us (GB/s, bw) | best [rows, warps, "
        "unroll] | M=2 older / fp8 gemv us | M=4 older / fp8 gemv us |",
        table,
    )


def _compile_one(job: tuple[Fp8GemvConfig, bool, int, bool]) -> str:
    from kernels.compile_check import loop_stats, resource_usage

    cfg, glu, bm, even = job
    name = (
        f"bn={cfg.bn} warps={cfg.warps} unroll={cfg.unroll} glu={int(glu)} bm={bm} even={int(even)}"
    )
    try:
        k = compile_fp8_gemv(cfg, glu=glu, bm=bm, even=even)
    except TritonError as e:  # report every variant, compiled or not
        return f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    st = loop_stats(k.asm["ptx"])
    ru = resource_usage(k)
    return (
        f"{name}: regs {ru.get('REG', '?')} stack {ru.get('STACK', '?')} | loop: "
        f"{st.loads_16b}/{st.loads} global loads 16 B wide, {st.shared} shared ld/st, "
        f"{st.barriers} barriers, {st.prmt} prmt"
    )


def compile_only(jobs: int) -> None:
    """Compile the sweep's kernel variants for sm_90 (no GPU) and print what each does."""
    t0 = time.time()
    variants = [
        (cfg, glu, bm, even)
        for cfg in SWEEP
        for glu in (False, True)
        for bm in (1, 2, 4)
        for even in (False, True)
    ]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        lines = list(pool.map(_compile_one, variants))
    print("\n".join(lines))
    failed = sum("FAILED" in line for line in lines)
    print(
        f"{len(lines) - failed}/{len(lines)} variants compiled for sm_90 in {time.time() - t0:.0f} s"
    )


def main() -> None:
    ap = sweep_arguments()
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90, no GPU")
    ap.add_argument("--jobs", type=int, default=4, help="compile processes (--compile-only)")
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args.jobs)
        return
    sweep_shapes(args, bench_shape, SHAPES, TABLE_PATH, "fp8_gemv_h200", write_md)


if __name__ == "__main__":
    main()

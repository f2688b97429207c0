# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""Decode GEMV of NVFP4 weights on CUDA: kernels/nvfp4_gemv.py against quant_linear(fmt="nvfp4").

    python -m bench.nvfp4_gemv_bench [--out DIR] [--write-table] [--quick] [--configs "4,2,1,1;..."]
    python -m bench.nvfp4_gemv_bench --compile-only      # no GPU: sm_90 compile + SASS counts

Per projection shape of Qwen3-8B and Qwen3.5-9B (bench/dense_gemv_bench.py SHAPES without the
GLU row and the LM heads) it times, under CUDA-graph replay, quant_linear's nvfp4 path (the
quant_gemv kernel at M <= 4) and every launch shape of SWEEP at M = 1, then the three best and
quant_linear at M = 2 and 4. Each timed call cycles through enough weight copies (over 400 MB)
that no call finds its weight in the 60 MB L2 (dense_gemv_bench's helpers). Every launch shape
is checked against the dequantised reference before it is timed. Writes nvfp4_gemv_h200.{json,md}
to --out; --write-table stores kernels/nvfp4_gemv_table.json: per weight, the best shape at each
M (1, 2, 4) where the kernel beat quant_linear.

--compile-only compiles each swept shape for sm_90 (triton.compile with a GPUTarget, no driver)
and prints the stage reached and, where ptxas and cuobjdump ran, the SASS instructions of the
main loop per 32-bit weight word.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import torch
import triton

from bench.dense_gemv_bench import (
    ROTATE_BYTES,
    SHAPES,
    _per_call,
    _save,
    copy_bandwidth,
    sweep_arguments,
    write_report,
)
from kernels.nvfp4_gemv import TABLE_PATH, Nvfp4GemvConfig, compile_nvfp4_gemv, nvfp4_gemv
from kernels.quant_gemm import dequantize_weight, quant_linear

# Qwen3-8B qkv, o, gate_up, down; Qwen3.5-9B in-projection, gated-attention qkv (o and down as
# Qwen3-8B's)
NK = list(dict.fromkeys((n, k) for n, k, glu in SHAPES if not glu and n < 100_000))
SWEEP = [
    Nvfp4GemvConfig(bn, warps, unroll, mma)
    for mma in (True, False)
    for bn in (2, 4, 8)
    for warps in (2, 4)
    for unroll in (1, 2)
    if not (warps == 2 and bn == 2)
]
QUICK_SWEEP = [Nvfp4GemvConfig(4, 4, 2, True), Nvfp4GemvConfig(8, 4, 1, True),
               Nvfp4GemvConfig(4, 4, 1, False), Nvfp4GemvConfig(8, 4, 1, False)]  # fmt: skip
SCALE_BYTES = (0x28, 0x30, 0x34, 0x38, 0x3C, 0x40)  # e4m3 2^-2 .. 2: no overflow in bf16 y


def _weights(N: int, K: int, copies: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random packed bytes (all 16 codes) and e4m3 scale bytes, made on the device."""
    sb = torch.tensor(SCALE_BYTES, dtype=torch.uint8, device="cuda")
    out = []
    for _ in range(copies):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
        s = sb[torch.randint(0, len(SCALE_BYTES), (N, K // 16), device="cuda")]
        out.append((w, s))
    return out


def _cfg(c: Nvfp4GemvConfig) -> list[int]:
    return [c.bn, c.warps, c.unroll, int(c.mma)]


def bench_shape(N: int, K: int, bw: float, sweep: list[Nvfp4GemvConfig]) -> dict:
    wbytes = N * K // 2 + N * K // 16
    copies = max(1, -(-ROTATE_BYTES // wbytes))
    ws = _weights(N, K, copies)
    g = 0.01
    row: dict = {"N": N, "K": K, "copies": copies}

    def rate(ms: float, M: int) -> float:
        return (wbytes + 2 * M * (K + N)) / (ms * 1e-3) / bw

    def old(x: torch.Tensor) -> float:
        return _per_call(lambda i: quant_linear(x, ws[i][0], ws[i][1], "nvfp4", g), copies)

    x4 = torch.randn(4, K, device="cuda", dtype=torch.bfloat16)
    ref = x4.float() @ dequantize_weight(ws[0][0], ws[0][1], "nvfp4", g).t()  # [4, N]

    def check(cfg: Nvfp4GemvConfig, M: int) -> None:
        y = nvfp4_gemv(x4[:M], ws[0][0], ws[0][1], g, cfg).float()
        err = float((y - ref[:M]).abs().max() / ref[:M].abs().max())
        assert err < 1e-2, (N, K, M, cfg, err)

    x1 = x4[:1].contiguous()
    t_old = old(x1)
    timed = []
    for cfg in sweep:
        check(cfg, 1)
        timed.append((_per_call(lambda i: nvfp4_gemv(x1, ws[i][0], ws[i][1], g, cfg), copies), cfg))
    timed.sort(key=lambda r: r[0])
    best_t, best = timed[0]
    row.update(
        old_ms=t_old, old_bw=rate(t_old, 1), best_ms=best_t, best_bw=rate(best_t, 1),
        best=_cfg(best), sweep=[_cfg(c) + [t, rate(t, 1)] for t, c in timed],
    )  # fmt: skip
    print(
        f"N={N} K={K}: quant_linear {t_old * 1e3:.1f} us ({rate(t_old, 1):.0%}), "
        f"nvfp4_gemv {best_t * 1e3:.1f} us ({rate(best_t, 1):.0%}) {row['best']}",
        flush=True,
    )
    row["wins"] = {"1": row["best"]} if best_t < t_old else {}
    for M in (2, 4):
        xm = x4[:M].contiguous()
        t_oldm = old(xm)
        tops = []
        for _, c in timed[:3]:
            check(c, M)
            tops.append((_per_call(lambda i: nvfp4_gemv(xm, ws[i][0], ws[i][1], g, c), copies), c))
        t_m, c_m = min(tops, key=lambda r: r[0])
        row[f"m{M}"] = {
            "old_ms": t_oldm,
            "best_ms": t_m,
            "best": _cfg(c_m),
            "best_bw": rate(t_m, M),
        }
        print(
            f"  M={M}: quant_linear {t_oldm * 1e3:.1f} us, nvfp4_gemv {t_m * 1e3:.1f} us "
            f"({rate(t_m, M):.0%}) {_cfg(c_m)}",
            flush=True,
        )
        if t_m < t_oldm:
            row["wins"][str(M)] = _cfg(c_m)
    return row


def write_md(path: Path, dev: str, bw: float, rows: list[dict]) -> None:
    table = []
    for r in rows:
        m2, m4 = r["m2"], r["m4"]
        gbs = r["best_bw"] * bw / 1e9
        table.append(
            f"| {r['N']} | {r['K']} | {r['old_ms'] * 1e3:.1f} ({r['old_bw']:.0%}) | "
            f"{r['best_ms'] * 1e3:.1f} ({r['best_bw']:.0%}) | {gbs:.0f} | {r['best']} | "
            f"{m2['old_ms'] * 1e3:.1f} / {m2['best_ms'] * 1e3:.1f} | "
            f"{m4['old_ms'] * 1e3:.1f} / {m4['best_ms'] * 1e3:.1f} |"
        )
    write_report(
        path,
        "`python -m bench.nvfp4_gemv_bench` (kernels/nvfp4_gemv.py against quant_linear "
        "nvfp4), CUDA-graph replay, medians",
        dev,
        bw,
        ". 'bw' = bytes moved (packed weight, scales, x, y) / time / copy bandwidth; every call "
        "reads a weight not in L2 (copies cycled, > 400 MB). Shape = [rows, warps, unroll, mma].",
        "| N | K | quant_linear us (bw) | nvfp4_gemv us (bw) | GB/s | best | "
        "M=2 old / new us | M=4 old / new us |",
        table,
    )


# -- --compile-only: sm_90 without a GPU ---------------------------------------------------------


def _loop_sass(cubin: bytes) -> int | None:
    """Instructions of the innermost backward-branch loop of a cubin (cuobjdump), or None."""
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    if not tool.exists():
        return None
    path = Path("/tmp/nvfp4_gemv_check.cubin")
    path.write_bytes(cubin)
    run = subprocess.run(
        [str(tool), "-sass", str(path)], capture_output=True, text=True, check=False
    )
    text = run.stdout
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = [
        (int(m.group(1), 16), a)
        for a, t in ins
        if "BRA" in t and (m := re.search(r"0x([0-9a-f]+)", t)) and int(m.group(1), 16) < a
    ]
    if not loops:
        return None
    lo, hi = max(loops, key=lambda r: r[1] - r[0])
    return sum(1 for a, _ in ins if lo <= a <= hi)


def compile_only(sweep: list[Nvfp4GemvConfig], shapes: list[tuple[int, int]]) -> None:
    seen = set()
    for cfg in sweep:
        for bm in (1, 2, 4):
            evens = {K % (cfg.bk * cfg.unroll) == 0 and N % cfg.bn == 0 for N, K in shapes}
            for even in sorted(evens):
                key = (cfg, bm, even)
                if key in seen:
                    continue
                seen.add(key)
                stage, per_word = "none", None
                try:
                    k = compile_nvfp4_gemv(cfg, bm=bm, even=even)
                    stage = "+".join(s for s in ("ttgir", "llir", "ptx", "cubin") if s in k.asm)
                    if "cubin" in k.asm and (n := _loop_sass(k.asm["cubin"])):
                        per_word = n / (cfg.bn * 4 * cfg.unroll)
                except Exception as e:  # noqa: BLE001  (report how far it got)
                    stage = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
                extra = f", {per_word:.1f} SASS/word" if per_word else ""
                print(f"{_cfg(cfg)} BM={bm} EVEN={even}: {stage}{extra}", flush=True)


def main() -> None:
    ap = sweep_arguments()
    ap.add_argument("--compile-only", action="store_true", help="sm_90 compile check, no GPU")
    ap.add_argument(
        "--configs", default=None, help="sweep only these shapes: 'bn,warps,unroll,mma;...'"
    )
    args = ap.parse_args()
    sweep = QUICK_SWEEP if args.quick else SWEEP
    if args.configs:
        sweep = [
            Nvfp4GemvConfig(bn, warps, unroll, bool(mma))
            for bn, warps, unroll, mma in (map(int, c.split(",")) for c in args.configs.split(";"))
        ]
    shapes = NK[:2] if args.quick else NK
    if args.compile_only:
        compile_only(sweep, shapes)
        return
    t0 = time.time()
    bw = copy_bandwidth()
    print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for N, K in shapes:
        rows.append(bench_shape(N, K, bw, sweep))
        torch.cuda.empty_cache()
    table = {f"{r['N']}:{r['K']}": r["wins"] for r in rows}
    out, dev = _save(args, TABLE_PATH, "nvfp4_gemv_h200.json", bw, rows, table, t0)
    write_md(out / "nvfp4_gemv_h200.md", dev, bw, rows)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

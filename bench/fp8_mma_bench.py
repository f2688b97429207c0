"""fp8 decode GEMV on tensor cores (kernels/fp8_mma.py) against the fp32-FMA one (kernels/fp8_gemv.py).

    python -m bench.fp8_mma_bench [--out DIR] [--write-table] [--quick]

Per projection shape of bench/fp8_gemv_bench.py, under CUDA-graph replay and with every call
reading a weight not in L2 (copies cycled, > 400 MB, as there): the FMA kernel at its table's
launch shape and every MMA launch shape of a small grid (rows per block x warps x programs per
SM, 0: one per block), at batch 1
(the MMA kernel takes one row of x). Every timed shape is first checked against the fp32
reference. Writes fp8_mma_h200.{json,md} to --out; --write-table stores
kernels/fp8_mma_table.json: per weight, the best MMA shape where it beat the FMA kernel
(quant_linear takes the MMA kernel there at batch 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.dense_gemv_bench import _per_call, sweep_arguments, sweep_shapes, write_report
from bench.fp8_gemv_bench import SHAPES, rotating_fp8
from kernels.fp8_gemv import Fp8GemvConfig, fp8_gemv, fp8_gemv_config, fp8_gemv_reference
from kernels.fp8_mma import TABLE_PATH, Fp8MmaConfig, fp8_mma

SWEEP = [
    Fp8MmaConfig(bn, warps, per_sm)
    for bn in (2, 4, 8)
    for warps in (1, 2, 4, 8)
    for per_sm in (0, 2, 4)
]
FMA_FALLBACK = Fp8GemvConfig(4, 4, 1)  # shapes the FMA table has no entry for


def bench_shape(N: int, K: int, glu: bool, bw: float, quick: bool) -> dict:
    wbytes, qs, ss = rotating_fp8(N, K)
    q, s, copies = qs[0], ss[0], len(qs)
    xk = 2 * K if glu else K
    row: dict = {"N": N, "K": K, "glu": glu, "copies": copies, "wins": {}}

    def share(ms: float, M: int) -> float:
        return (wbytes + 2 * M * (xk + N)) / (ms * 1e-3) / bw

    def check(x: torch.Tensor, cfg: Fp8MmaConfig) -> None:
        ref = fp8_gemv_reference(x, q, s, glu=glu).float()
        err = float((fp8_mma(x, q, s, cfg, glu=glu).float() - ref).abs().max() / ref.abs().max())
        assert err < 2e-2, (N, K, glu, x.shape[0], cfg, err)

    def fma(x: torch.Tensor) -> float:
        cfg = fp8_gemv_config(N, K, x.shape[0], glu) or FMA_FALLBACK
        return _per_call(lambda i: fp8_gemv(x, qs[i], ss[i], cfg, glu=glu), copies)

    def mma(x: torch.Tensor, cfg: Fp8MmaConfig) -> float:
        return _per_call(lambda i: fp8_mma(x, qs[i], ss[i], cfg, glu=glu), copies)

    x = torch.randn(1, xk, device="cuda", dtype=torch.bfloat16)
    t_fma = fma(x)
    timed = []
    for cfg in SWEEP[::3] if quick else SWEEP:
        check(x, cfg)
        timed.append((mma(x, cfg), cfg))
    timed.sort(key=lambda r: r[0])
    row["sweep"] = [[c.bn, c.warps, c.per_sm, t] for t, c in timed]
    t, best = timed[0]
    row["m1"] = {"fma_ms": t_fma, "fma_bw": share(t_fma, 1), "mma_ms": t,
                 "mma_bw": share(t, 1), "best": [best.bn, best.warps, best.per_sm]}  # fmt: skip
    print(
        f"N={N} K={K} glu={glu}: fma {t_fma * 1e3:.1f} us ({share(t_fma, 1):.0%}), "
        f"mma {t * 1e3:.1f} us ({share(t, 1):.0%}) {row['m1']['best']}",
        flush=True,
    )
    if t < t_fma:
        row["wins"]["1"] = [best.bn, best.warps, best.per_sm]
    return row


def write_md(path, dev: str, bw: float, rows: list[dict]) -> None:
    table = [
        f"| {r['N']} | {r['K']} | {'yes' if r['glu'] else 'no'} | "
        f"{r['m1']['fma_ms'] * 1e3:.1f} ({r['m1']['fma_bw']:.0%}) | "
        f"{r['m1']['mma_ms'] * 1e3:.1f} ({r['m1']['mma_bw']:.0%}) | {r['m1']['best']} |"
        for r in rows
    ]
    write_report(
        path,
        "`python -m bench.fp8_mma_bench` (kernels/fp8_mma.py against kernels/fp8_gemv.py), "
        "CUDA-graph replay",
        dev,
        bw,
        "; share = weight + scale + x + y bytes / time / copy bandwidth; every call reads a "
        "weight not in L2.",
        "| N | K | GLU | fma us (bw) | mma us (bw) | best [rows, warps, programs per SM] |",
        table,
    )


def rerender(json_path: Path) -> None:
    """Rewrite the Markdown report beside a JSON one (after a change to its layout)."""
    d = json.loads(json_path.read_text())
    write_md(json_path.with_suffix(".md"), d["device"], d["copy_bw"], d["rows"])


def main() -> None:
    args = sweep_arguments().parse_args()
    sweep_shapes(args, bench_shape, SHAPES, TABLE_PATH, "fp8_mma_h200", write_md)


if __name__ == "__main__":
    main()

"""Which kernel, with which launch shape, runs a dense (bf16 / f16 / f32) GEMM on cuda, per
number of rows of x: the choice the H200 sweeps recorded in kernels/gemv_table.json and
kernels/skinny_table.json, made here at compile time so that the plan shows it and the CUDA
executor only follows it.

    rows 1, 2, 3-4   triton.gemv [bn, warps, unroll]  where the GEMV table (or, for a shape the
                     sweep did not measure, the batch-1 default) says it beats cuBLAS
    rows 5-8, 9-16   triton.gemm_skinny [bn, bk, stages, warps]  where the tile table says so
    otherwise        cublas.gemm

Table files (written by `python -m bench.dense_gemv_bench --write-table`):
    gemv_table.json    {"N:K:glu": {"M": [bn, warps, unroll]}}   M in 1, 2, 4; a measured weight
                       with no entry at M: cuBLAS won there
    skinny_table.json  {"N:K": {"M": [bn, bk, stages, warps]}}   M in 8, 16

A launch is `[first_row, last_row, kernel, config]` (JSON in the plan's call attrs, `launch`);
rows past every launch run the call's own kernel (cublas.gemm).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

# the kernels package sits beside ninfer (source tree and install alike); read, never imported
KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
GEMV = "triton.gemv"
SKINNY = "triton.gemm_skinny"
CUBLAS = "cublas.gemm"
GEMV_DEFAULT_M1 = (1, 4, 2)  # batch 1 beat cuBLAS at every shape of the H200 sweep
# row buckets: (first row, last row, the table's M for them)
GEMV_BUCKETS = ((1, 1, 1), (2, 2, 2), (3, 4, 4))
SKINNY_BUCKETS = ((5, 8, 8), (9, 16, 16))

Table = dict[tuple[int, ...], tuple[int, ...]]


def read_gemv_table(path: Path) -> tuple[Table, set[tuple[int, int, bool]]]:
    """({(N, K, glu, M): config}, the measured (N, K, glu)) of a GEMV table file."""
    table: Table = {}
    measured: set[tuple[int, int, bool]] = set()
    if not path.exists():
        return table, measured
    for key, per_m in json.loads(path.read_text()).items():
        n, k, glu = (int(v) for v in key.split(":"))
        measured.add((n, k, bool(glu)))
        for m, fields in per_m.items():
            table[(n, k, int(glu), int(m))] = tuple(int(v) for v in fields)
    return table, measured


def read_skinny_table(path: Path) -> Table:
    """{(N, K, M): config} of a tile table file."""
    if not path.exists():
        return {}
    return {
        (*(int(v) for v in key.split(":")), int(m)): tuple(int(v) for v in fields)
        for key, per_m in json.loads(path.read_text()).items()
        for m, fields in per_m.items()
    }


@functools.cache
def _tables() -> tuple[Table, set[tuple[int, int, bool]], Table]:
    gemv, measured = read_gemv_table(KERNELS_DIR / "gemv_table.json")
    return gemv, measured, read_skinny_table(KERNELS_DIR / "skinny_table.json")


def dense_launches(
    N: int, K: int, glu: bool, tables: tuple[Table, set, Table] | None = None
) -> list[list[Any]]:
    """The launches of x [rows, K (2K with glu)] against a dense [N, K] weight (module
    docstring); adjacent buckets with the same choice are merged; cuBLAS buckets are left out."""
    gemv, measured, skinny = tables or _tables()
    out: list[list[Any]] = []
    for lo, hi, m in GEMV_BUCKETS:
        if (N, K, glu) in measured:
            cfg = gemv.get((N, K, int(glu), m))
        else:
            cfg = GEMV_DEFAULT_M1 if m == 1 else None
        _add(out, lo, hi, GEMV, cfg)
    for lo, hi, m in SKINNY_BUCKETS:
        _add(out, lo, hi, SKINNY, skinny.get((N, K, m)))
    return out


def _add(out: list[list[Any]], lo: int, hi: int, kernel: str, cfg: tuple[int, ...] | None) -> None:
    if cfg is None:
        return
    if out and out[-1][1] == lo - 1 and out[-1][2] == kernel and out[-1][3] == list(cfg):
        out[-1][1] = hi
    else:
        out.append([lo, hi, kernel, list(cfg)])

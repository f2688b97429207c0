"""The drafters' dense GEMM launches on CUDA: the kernel the H200 sweeps chose for a weight
shape and row count (ninfer/passes/gemm_launch.py's tables: kernels.gemv for 1-4 rows, the
tensor-core skinny tiles for 5-16, else cuBLAS). The drafters' weights are not in the target's
plan, so their launches are chosen here, once per call site (each call is captured in a CUDA
Graph). A shape the sweep did not measure (a reduced head) takes the skinny tiles of the
nearest measured width of the same depth."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.gemv import DenseGemvConfig, SkinnyConfig, dense_gemv, dense_skinny
from ninfer.passes.gemm_launch import (
    GEMV,
    KERNELS_DIR,
    SKINNY,
    dense_launches,
    read_skinny_table,
)

Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@functools.cache
def _skinny_table() -> dict:
    return read_skinny_table(KERNELS_DIR / "skinny_table.json")


def dense_gemm(N: int, K: int, M: int) -> Gemm:
    """(x [M, K], w [N, K]) -> x @ wᵀ by the kernel the sweeps chose (module docstring)."""
    for lo, hi, kernel, cfg in dense_launches(N, K, False):
        if lo <= M <= hi and kernel == GEMV:
            gemv = DenseGemvConfig(*cfg)
            return lambda x, w: dense_gemv(x, w, gemv)
        if lo <= M <= hi and kernel == SKINNY:
            tiles = SkinnyConfig(*cfg)
            return lambda x, w: dense_skinny(x, w, tiles)
    table = _skinny_table()
    bucket = 8 if M <= 8 else 16
    if 5 <= M <= 16 and not any((N, K, b) in table for b in (8, 16)):  # not measured
        near = [(abs(n.bit_length() - N.bit_length()), n) for n, k, b in table if k == K and b == bucket]  # fmt: skip
        if near:
            tiles = SkinnyConfig(*table[(min(near)[1], K, bucket)])
            return lambda x, w: dense_skinny(x, w, tiles)
    return F.linear

"""One call of each decode GEMV at Qwen3-8B shapes, batch 1, for Nsight Compute:

    ncu --profile-from-start off --clock-control none --cache-control all \
        --section SpeedOfLight --section Occupancy --section SchedulerStats \
        --section WarpStateStats python3 bench/ncu_gemv.py

Each kernel runs once un-profiled (compilation, warm-up), then once between
cudaProfilerStart / Stop. Kernels: kernels/gemv.py (bf16), kernels/fp8_gemv.py,
kernels/fp8_mma.py (where its table has a shape; and its nvfp4 path on kernels/nvfp4_mma.py's
repacked words) and kernels/nvfp4_gemv.py with their table's
launch shape, each as a decode step runs it (the quantised gate/up projections with the SwiGLU
epilogue, the bf16 down projection with the SwiGLU folded into its input). `--only mma,nvfp4` keeps those kernels (names: dense, fma, mma, nvfp4, nvfp4mma).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import torch

from kernels.fp8_gemv import fp8_gemv, fp8_gemv_config
from kernels.fp8_mma import fp8_mma, fp8_mma_config, nvfp4_mma_config
from kernels.gemv import DenseGemvConfig, dense_gemv
from kernels.nvfp4_gemv import nvfp4_gemv
from kernels.nvfp4_mma import prepare
from kernels.quant_gemm import quantize_weight_fp8, quantize_weight_nvfp4
from ninfer.ir.plan import launch_for
from ninfer.passes.gemm_launch import CUBLAS, dense_launches

# (N, K, down projection): q/k/v, o, gate/up, down of Qwen3-8B
SHAPES = [(6144, 4096, False), (4096, 4096, False), (24576, 4096, False), (4096, 12288, True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="dense,fma,mma,nvfp4,nvfp4mma")
    only = set(p.parse_args().only.split(","))
    torch.manual_seed(0)
    named: list[tuple[str, Callable[[], torch.Tensor]]] = []
    for N, K, down in SHAPES:
        # as a decode step runs them: the bf16 down projection computes the SwiGLU of x =
        # [gate | up] itself, the fp8 / nvfp4 gate/up projections write it (their epilogue)
        w = torch.randn(N, K, device="cuda") * 0.05
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        x2 = torch.randn(1, 2 * K, device="cuda", dtype=torch.bfloat16)
        wb = w.to(torch.bfloat16)
        kernel, fields = launch_for(dense_launches(N, K, down), 1, CUBLAS)  # as a plan runs it
        dcfg = DenseGemvConfig(*fields) if kernel != CUBLAS else None
        named.append(("dense", partial(dense_gemv, x2 if down else x, wb, dcfg, glu=down)))
        q, s = quantize_weight_fp8(w)
        named.append(("fma", partial(fp8_gemv, x, q, s, fp8_gemv_config(N, K, 1))))
        gu = N == 24576
        mcfg = fp8_mma_config(N, K, 1)
        if mcfg is not None:
            named.append(("mma", partial(fp8_mma, x, q, s, mcfg, swiglu_out=gu)))
        q4, s4, g4 = quantize_weight_nvfp4(w)
        named.append(("nvfp4", partial(nvfp4_gemv, x, q4, s4, g4, swiglu_out=gu)))
        ncfg = nvfp4_mma_config(N, K, 1)
        if ncfg is not None:
            w4 = prepare(q4, s4, g4)
            named.append(("nvfp4mma", partial(fp8_mma, x, w4, None, ncfg, swiglu_out=gu)))
    calls = [c for name, c in named if name in only]
    for c in calls:
        c()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for c in calls:
        c()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()

"""One call of each decode GEMV at Qwen3-8B shapes, batch 1, for Nsight Compute:

    ncu --profile-from-start off --clock-control none --cache-control all \
        --section SpeedOfLight --section Occupancy --section SchedulerStats \
        --section WarpStateStats python3 bench/ncu_gemv.py

Each kernel runs once un-profiled (compilation, warm-up), then once between
cudaProfilerStart / Stop. Kernels: kernels/gemv.py (bf16), kernels/fp8_gemv.py and
kernels/nvfp4_gemv.py with their table's launch shape.
"""

from __future__ import annotations

import torch

from kernels.fp8_gemv import fp8_gemv, fp8_gemv_config
from kernels.gemv import dense_gemv, dense_gemv_config
from kernels.nvfp4_gemv import nvfp4_gemv
from kernels.quant_gemm import quantize_weight_fp8, quantize_weight_nvfp4

SHAPES = [(6144, 4096, False), (4096, 4096, False), (24576, 4096, False), (4096, 12288, True)]


def main() -> None:
    torch.manual_seed(0)
    calls = []
    for N, K, glu in SHAPES:
        w = torch.randn(N, K, device="cuda") * 0.05
        x = torch.randn(1, 2 * K if glu else K, device="cuda", dtype=torch.bfloat16)
        wb = w.to(torch.bfloat16)
        calls.append(
            lambda x=x, wb=wb, glu=glu: dense_gemv(
                x, wb, dense_gemv_config(*wb.shape, 1, glu), glu=glu
            )
        )
        q, s = quantize_weight_fp8(w)
        calls.append(
            lambda x=x, q=q, s=s, glu=glu: fp8_gemv(
                x, q, s, fp8_gemv_config(*q.shape, 1, glu), glu=glu
            )
        )
        if not glu:
            q4, s4, g4 = quantize_weight_nvfp4(w)
            calls.append(lambda x=x, q4=q4, s4=s4, g4=g4: nvfp4_gemv(x, q4, s4, g4))
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

"""Time the nvfp4 tensor-core decode GEMV (kernels/fp8_mma.py on kernels/nvfp4_mma.py's words)
alone: one launch shape against one weight shape, per launch, as a CUDA graph of back-to-back
launches with programmatic dependent launch, rotating weight copies so that each launch reads
from DRAM. The ratio is to the copy bandwidth given (default 4,260 GB/s, the H200's measured).

    python3 bench/nvfp4_mma_time.py K:GLU:CFG:N1,N2 ...   # CFG = bn,warps,per_sm[,maxnreg]

e.g. `12288:0:8,4,0:3168,4096` (the down projection at 3 and 4 programs' rows per SM). Against
`bench/profile_step.py --variant`, which times a shape inside the decode step: a kernel alone
keeps the tail that the next kernel's early loads fill in the step.
"""

from __future__ import annotations

import argparse

import torch

from kernels.fp8_mma import Fp8MmaConfig, fp8_mma
from kernels.nvfp4_mma import prepare
from kernels.quant_gemm import quantize_weight_nvfp4


def time_launch(K: int, glu: bool, cfg: Fp8MmaConfig, N: int, reps: int = 40) -> float:
    """Median microseconds per launch of an [N, K] nvfp4 weight (glu: swiglu_out)."""
    copies = min(12, max(2, int(200e6 // (N * K * 0.5625)) + 1))  # > 200 MB: beyond L2
    ws = [prepare(*quantize_weight_nvfp4(torch.randn(N, K, device="cuda") * 0.05))
          for _ in range(copies)]  # fmt: skip
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    for w in ws:  # compile and warm up outside the capture
        fp8_mma(x, w, None, cfg, swiglu_out=glu)
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for r in range(reps):
            fp8_mma(x, ws[r % copies], None, cfg, swiglu_out=glu)
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="+", metavar="K:GLU:CFG:N1,N2")
    p.add_argument("--bandwidth", type=float, default=4260.0, help="copy bandwidth, GB/s")
    args = p.parse_args()
    for spec in args.specs:
        k, glu, cfg, ns = spec.split(":")
        config = Fp8MmaConfig(*(int(v) for v in cfg.split(",")))
        for n in (int(v) for v in ns.split(",")):
            us = time_launch(int(k), glu == "1", config, n)
            ideal = n * int(k) * 0.5625 / (args.bandwidth * 1e3)
            print(f"K={k} glu={glu} cfg={cfg} N={n}: {us:.2f} us, {100 * ideal / us:.0f}% of copy")


if __name__ == "__main__":
    main()

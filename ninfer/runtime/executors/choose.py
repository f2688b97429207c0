"""Choose the executor for a plan's device without importing the CUDA stack on CPU.

The CUDA executor pulls in Triton and the kernels; a CPU-only install (no triton) must still
serve, so the import happens only when a CUDA device is asked for.
"""

from __future__ import annotations

from typing import Any


def make_executor(plan: Any, artifact: Any, device: Any = None, **kwargs: Any) -> Any:
    """CudaExecutor on a CUDA device, the reference CPU Executor otherwise."""
    dev = str(device if device is not None else plan.device)
    if dev.startswith("cuda"):
        from ninfer.runtime.executors.cuda.executor import make_executor as make_cuda

        return make_cuda(plan, artifact, device, **kwargs)
    from ninfer.runtime.executors.cpu.executor import Executor

    return Executor(plan, artifact, device or "cpu")

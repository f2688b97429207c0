"""Launch-time facts shared by the kernel wrappers."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# The decode GEMVs read every weight byte once per step, gigabytes of them, so their weight
# loads are marked evict-first: streaming through L2 they then displace one another rather than
# what the latency-bound kernels between them read again (activations, the KV cache, norm
# gains). H200, one device call, one process each: fp8 graph step 2.604 -> 2.559 ms, bf16 4.021 -> 3.992 ms.
WEIGHT_EVICT = tl.constexpr("evict_first")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def f32_dot(dtype: torch.dtype) -> bool:
    """Whether tl.dot should take fp32 operands (exact "ieee" precision) for inputs of
    ``dtype``: for fp32 inputs, and always under the interpreter, whose bf16 tl.dot is wrong
    (triton 3.9)."""
    return dtype == torch.float32 or interpreting()


def hw_fp8() -> bool:
    """Whether kernels may convert float8 in hardware (tl.float8e4nv): not in the interpreter."""
    return not interpreting()


# -- programmatic dependent launch --------------------------------------------------------------
#
# A decode step is ~330 short kernels in a row. Launched with programmatic dependent launch
# (Hopper and later), a kernel's programs are placed on the SMs while the kernel before it is
# still finishing, and each program blocks in `pdl_wait` until that kernel has completed and its
# writes are visible. What a program does before `pdl_wait` overlaps the previous kernel's tail:
# the GEMVs issue their first weight loads there (weights are never written during a step).
#
# The contract for a kernel that takes a PDL constexpr: before `pdl_wait` it reads only memory no
# kernel writes (weights, constant tables) and writes nothing; every program reaches `pdl_wait`.
# Its wrapper launches it with `**pdl_args(device)`, which sets PDL and launch_pdl together.
# Ordering stays transitive: a kernel past its wait implies the previous one completed, which
# (if it was launched the same way) implies the one before it did.


@functools.cache
def _pdl_capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


@functools.cache
def _pdl_enabled() -> bool:
    return os.environ.get("NINFER_PDL", "1") != "0"


def pdl_args(device: torch.device) -> dict[str, bool]:
    """Launch arguments of a PDL-aware kernel on ``device``: programmatic dependent launch on
    CUDA devices of compute capability 9.0 and later, off on others, under the interpreter and
    with NINFER_PDL=0 (read once per process)."""
    on = (
        device.type == "cuda"
        and not interpreting()
        and _pdl_enabled()
        and _pdl_capable(device.index if device.index is not None else torch.cuda.current_device())
    )
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Block until the kernel this one depends on has completed and its writes are visible,
    then let the next kernel's programs be placed (see the section comment). No-op when the
    kernel was not launched with PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

"""Launch-time facts shared by the kernel wrappers."""

from __future__ import annotations

import os

import torch


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

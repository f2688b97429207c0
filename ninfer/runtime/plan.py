"""The execution plan the runtime executes (defined in ninfer.ir.plan, the lowest IR level,
so the compiler can produce it without importing the runtime), and the one call that makes it.
"""

from __future__ import annotations

from ninfer.ir.plan import PLAN_VERSION, BufferSpec, KernelCall, Plan
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact

__all__ = ["PLAN_VERSION", "BufferSpec", "CompileOptions", "KernelCall", "Plan", "compile_artifact"]

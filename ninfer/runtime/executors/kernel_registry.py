"""The kernel registry: the implementations an executor can run, keyed by the kernel names the
plan prints (ninfer/passes/assign_kernels.py chooses them; `ninfer compile` shows them).

An executor resolves every call of its plan here once, at construction: `call.kernel` for a
prefill-class step and `call.attrs["decode_kernel"]` (where the plan names one) for a decode
step. A plan naming a kernel this registry lacks is refused then, not mid-step; the executor
never picks an implementation by op kind.

A key is (kernel name, op kind): one kernel may implement ops of different signatures (the same
GEMM serves `linear` and `logits`). `traced(log)` returns a registry whose implementations
append their kernel name to `log` before running (tests compare it with the plan), the
launch a call's rows chose included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ninfer.ir.plan import KernelCall

Impl = Callable[..., Any]


class KernelRegistry:
    def __init__(self, device: str, kernels: Mapping[tuple[str, str], Impl]):
        self.device = device
        self._kernels = dict(kernels)

    def extended(self, kernels: Mapping[tuple[str, str], Impl]) -> KernelRegistry:
        """This registry plus `kernels` (the collectives of a tensor-parallel rank)."""
        return KernelRegistry(self.device, {**self._kernels, **kernels})

    def names(self) -> set[str]:
        return {name for name, _ in self._kernels}

    def lookup(self, kernel: str, op: str) -> Impl:
        """The implementation of `kernel` for an op of kind `op`; ValueError naming both when
        this executor has none."""
        impl = self._kernels.get((kernel, op))
        if impl is None:
            raise ValueError(
                f"the plan names kernel {kernel} for op {op}, which the {self.device} executor "
                "does not have (compile the plan for this device)"
            )
        return impl

    def resolve(self, call: KernelCall, decode: bool) -> Impl:
        """What runs `call` in a decode step (`decode`) or any other step. A call with
        `launch` attrs (ninfer/passes/gemm_launch.py) runs the kernel its launch names for the
        rows of its first input, with that launch's config (`config=`), else its own kernel."""
        name = call.attrs.get("decode_kernel", call.kernel) if decode else call.kernel
        impl = self.lookup(name, call.op)
        launches = call.attrs.get("launch")
        if not launches:
            return impl
        table = [(lo, hi, self.lookup(k, call.op), tuple(cfg)) for lo, hi, k, cfg in launches]

        def by_rows(ctx: Any, attrs: dict, x: Any, *rest: Any) -> Any:
            rows = x.numel() // x.shape[-1] if x.numel() else 0  # x [..., K]
            for lo, hi, launch, cfg in table:
                if lo <= rows <= hi:
                    return launch(ctx, attrs, x, *rest, config=cfg)
            return impl(ctx, attrs, x, *rest)

        return by_rows

    def traced(self, log: list[str]) -> KernelRegistry:
        def wrap(name: str, impl: Impl) -> Impl:
            def run(*args: Any, **kwargs: Any) -> Any:
                log.append(name)
                return impl(*args, **kwargs)

            return run

        return KernelRegistry(
            self.device, {key: wrap(key[0], impl) for key, impl in self._kernels.items()}
        )

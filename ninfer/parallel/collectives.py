"""The collective kernels of a tensor-parallel plan (`dist.all_reduce`, `dist.all_gather`;
passes/assign_kernels.py names them on either device): torch.distributed over the ranks'
data group, gloo on cpu and nccl on cuda, the same code.

    all_reduce  x [T, hidden], a partial sum on every rank -> the sum, on every rank
    all_gather  x [R, ceil(V/N)] this rank's vocabulary part of the logits (the last ranks'
                parts padded to that width) -> [R, V], the parts in rank order
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ninfer.passes.assign_kernels import collective_kernel
from ninfer.runtime.executors.kernel_registry import Impl


def collective_kernels(group: Any) -> dict[tuple[str, str], Impl]:
    """The `dist.*` kernels over process group `group`, keyed as a KernelRegistry wants."""

    def all_reduce(ctx: Any, a: dict, x: torch.Tensor) -> torch.Tensor:
        if x.numel():
            x = x.contiguous()
            dist.all_reduce(x, group=group)  # x is this call's own output: summed in place
        return x

    def all_gather(ctx: Any, a: dict, x: torch.Tensor) -> torch.Tensor:
        size, parts = a["size"], a["parts"]
        piece = -(-size // parts)
        if x.shape[0] == 0:  # no row wants logits this step (every rank alike)
            return x.new_empty((0, size))
        x = F.pad(x, (0, piece - x.shape[-1])).contiguous()
        out = [torch.empty_like(x) for _ in range(parts)]
        dist.all_gather(out, x, group=group)
        return torch.cat(out, dim=-1)[:, :size]

    return {
        (collective_kernel("all_reduce"), "all_reduce"): all_reduce,
        (collective_kernel("all_gather"), "all_gather"): all_gather,
    }

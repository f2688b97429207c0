"""Load a plan's weight buffers from the artifact as torch tensors in the compute dtype.

The reference executor dequantises every storage format (bf16, fp8, nvfp4, gguf:*) with the
artifact's reference dequantiser at load time, then builds derived layouts:

    plain         the tensor                          [N, K] (or its own shape)
    concat        cat(sources, dim=0)                 [sum N_i, K]      fused GEMMs
    stack         stack(sources)                      [E, N, K]         MoE experts
    stack_concat  stack(cat(g_e, u_e) for each e)     [E, 2I, H]        fused expert gate|up

A weight of a tensor-parallel rank's plan keeps only its part of each source (`spec.shards`,
ninfer.ir.graph.Shard), cut before the copy to float32, so a rank reads 1/N of the bytes.

except the GGUF weights only `cpu.*` kernels read (a CPU plan with cpu_weights="packed"): those
stay packed as kernels/cpu_quant.PackedWeight (plain or concat layout), with the int4 GEMM
layout when a `cpu.*_int4pack` GEMM reads them, an f16 copy when `cpu.logits_f16` does and the
raw blocks when `cpu.gguf_rows` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kernels.cpu_quant import PackedWeight, pack_gguf
from ninfer.artifact.format import Artifact
from ninfer.ir.graph import Shard
from ninfer.ir.plan import BufferSpec, Plan
from ninfer.passes.assign_kernels import CPU_PACKED_GEMMS, CPU_PACKED_LOGITS, CPU_PACKED_ROWS

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def take_shard(a: Any, shard: Shard | None, cat: Callable[..., Any] = np.concatenate) -> Any:
    """The part `shard` keeps of array `a` (numpy, or torch with `cat=torch.cat`): its index
    ranges along `shard.dim`, concatenated in order; `a` itself for None."""
    if shard is None:
        return a
    pieces = []
    for r in shard.ranges(a.shape[shard.dim]):
        index = [slice(None)] * a.ndim
        index[shard.dim] = slice(r.start, r.stop)
        pieces.append(a[tuple(index)])
    return pieces[0] if len(pieces) == 1 else cat(pieces, shard.dim)


def _dense(artifact: Artifact, name: str, shard: Shard | None = None) -> torch.Tensor:
    part = take_shard(artifact.dense(name), shard)
    return torch.from_numpy(np.array(part, dtype=np.float32, copy=True))


def load_weight(
    artifact: Artifact, spec: BufferSpec, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    shards = spec.shards or (None,) * len(spec.sources)
    srcs = [_dense(artifact, s, shard) for s, shard in zip(spec.sources, shards)]
    if spec.layout == "plain":
        t = srcs[0]
    elif spec.layout == "concat":
        t = torch.cat(srcs, dim=0)
    elif spec.layout == "stack":
        t = torch.stack(srcs)
    elif spec.layout == "stack_concat":
        e = len(srcs) // 2
        t = torch.stack([torch.cat([srcs[i], srcs[e + i]], dim=0) for i in range(e)])
    else:
        raise ValueError(f"weight {spec.name}: unknown layout {spec.layout!r}")
    return t.to(device=device, dtype=dtype).contiguous()


def _readers(plan: Plan) -> dict[str, set[str]]:
    """weight name -> kernels of the calls that read it."""
    out: dict[str, set[str]] = {}
    for c in plan.calls:
        for n in c.inputs:
            out.setdefault(n, set()).add(c.kernel)
    return out


def load_packed(artifact: Artifact, spec: BufferSpec, kernels: set[str]) -> PackedWeight:
    """The GGUF weight `spec` packed for the `cpu.*` kernels that read it."""
    k = int(artifact.info(spec.sources[0]).shape[-1])
    raws = [artifact.array(s) for s in spec.sources]
    gemm = bool(kernels & set(CPU_PACKED_GEMMS.values()))
    return pack_gguf(
        spec.format or "",
        raws,
        k,
        gemm=gemm,
        rows=CPU_PACKED_ROWS in kernels,
        half=CPU_PACKED_LOGITS in kernels,
    )


def _packed(spec: BufferSpec, kernels: set[str], device: torch.device) -> bool:
    packed = set(CPU_PACKED_GEMMS.values()) | {CPU_PACKED_ROWS, CPU_PACKED_LOGITS}
    return (
        device.type == "cpu"
        and not spec.shards  # a rank's part of a weight is loaded dense (assign_kernels)
        and (spec.format or "") in CPU_PACKED_GEMMS  # not a float bias the same call reads
        and spec.layout in ("plain", "concat")
        and bool(kernels)
        and kernels <= packed
    )


def load_weights(
    plan: Plan, artifact: Artifact, device: torch.device
) -> dict[str, torch.Tensor | PackedWeight]:
    """name -> tensor (compute dtype of the plan) or packed weight for every weight buffer."""
    dtype = TORCH_DTYPES[plan.dtype]
    readers = _readers(plan)
    out: dict[str, torch.Tensor | PackedWeight] = {}
    for b in plan.weights():
        kernels = readers.get(b.name, set())
        if _packed(b, kernels, device):
            out[b.name] = load_packed(artifact, b, kernels)
        else:
            out[b.name] = load_weight(artifact, b, dtype, device)
    return out

"""Load a plan's weight buffers from the artifact as torch tensors in the compute dtype.

The reference executor dequantises every storage format (bf16, fp8, nvfp4, gguf:*) with the
artifact's reference dequantiser at load time, then builds derived layouts:

    plain         the tensor                          [N, K] (or its own shape)
    concat        cat(sources, dim=0)                 [sum N_i, K]      fused GEMMs
    stack         stack(sources)                      [E, N, K]         MoE experts
    stack_concat  stack(cat(g_e, u_e) for each e)     [E, 2I, H]        fused expert gate|up
"""

from __future__ import annotations

import numpy as np
import torch

from ninfer.artifact.format import Artifact
from ninfer.ir.plan import BufferSpec, Plan

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _dense(artifact: Artifact, name: str) -> torch.Tensor:
    return torch.from_numpy(np.array(artifact.dense(name), dtype=np.float32, copy=True))


def load_weight(
    artifact: Artifact, spec: BufferSpec, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    srcs = [_dense(artifact, s) for s in spec.sources]
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


def load_weights(plan: Plan, artifact: Artifact, device: torch.device) -> dict[str, torch.Tensor]:
    """name -> tensor for every weight buffer of `plan` (compute dtype of the plan)."""
    dtype = TORCH_DTYPES[plan.dtype]
    return {b.name: load_weight(artifact, b, dtype, device) for b in plan.weights()}

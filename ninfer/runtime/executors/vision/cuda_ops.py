"""The vision plan's kernels on the CUDA executor: torch implementations, named `torch.<op>` in
cuda plans (ninfer/passes/assign_kernels.py, VISION_CUDA_KERNELS), as no Triton kernel of
kernels/ covers them.

- The vision stage's ops (patch_embed ... merge_rows) run once per image or video, eagerly,
  outside CUDA Graphs: the torch references of ninfer/runtime/executors/vision/ops.py, except
  `vision_attention`, which batches equal segments (a video's frames) into one
  scaled_dot_product_attention instead of one launch per frame.
- `media_merge` runs in the step (eager prefill; in a captured decode step it has no rows).
- `rotary_mrope`: the text model's rotary over 3-axis positions [3, T] (the fused attention
  prologue and kernels.rotary take [T]). It reads no device value on the host, so a decode step
  of a vision plan is captured into a CUDA Graph like any other.

Each op is `fn(ctx, attrs, *inputs)` like ninfer.runtime.executors.cuda.ops; `ctx` is the executor's
DeviceStep in the step and a VisionContext in the vision stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ninfer.passes.assign_kernels import CUDA_ROTARY_MROPE, VISION_CUDA_KERNELS
from ninfer.runtime.executors.cpu import ops as ops_torch
from ninfer.runtime.executors.vision.ops import VISION_OPS, VisionContext


def vision_attention(
    ctx: VisionContext, a: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
):
    """Bidirectional attention within each segment; consecutive segments of one length (the
    frames of a video) run as one batched launch."""
    h, d = a["heads"], a["head_dim"]
    out = torch.empty_like(q)
    segs = ctx.segments
    i = 0
    while i < len(segs):
        begin, n = segs[i]
        j = i + 1
        while j < len(segs) and segs[j] == (begin + (j - i) * n, n):
            j += 1
        rows = slice(begin, begin + (j - i) * n)
        # [frames, H, n, D]
        qs, ks, vs = (t[rows].reshape(j - i, n, h, d).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=a["scale"])
        out[rows] = o.transpose(1, 2).reshape((j - i) * n, h * d)
        i = j
    return out


def rotary_mrope(s: Any, a: dict, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
    """Rotate-half rotary of q and k [T, heads * head_dim] by positions [3, T]: frequency j
    turns with axis rope["mrope_axes"][j] (transformers' interleaved T/H/W sections), computed
    in float32 and cast as the reference executor does (ninfer.runtime.executors.cpu.ops.rotary)."""
    d, rd = a["head_dim"], a["rotary_dim"]
    rope = a["rope"]
    key = f"mrope/{sorted(rope.items())}/{rd}"
    cache = s.inv_freq
    if key not in cache:  # once per executor (the first prefill, before any graph capture)
        cache[key] = ops_torch._inv_freq(rope, rd).to(q.device)
        cache[key + "/axes"] = torch.tensor(rope["mrope_axes"], device=q.device)
    inv, axes = cache[key], cache[key + "/axes"]
    freqs = pos.float().index_select(0, axes).T * inv[None, :]  # [T, rd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    scale = ops_torch.rope_scale(rope)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    cos, sin = cos.to(q.dtype)[:, None, :], sin.to(q.dtype)[:, None, :]  # [T, 1, rd]

    return ops_torch.rotate_half(q, cos, sin, d, rd), ops_torch.rotate_half(k, cos, sin, d, rd)


def cuda_vision_kernels() -> dict[tuple[str, str], Callable[..., Any]]:
    """(kernel name, op kind) -> implementation: the entries the CUDA kernel registry adds."""
    impls = {**VISION_OPS, "vision_attention": vision_attention}
    out: dict[tuple[str, str], Callable[..., Any]] = {
        (VISION_CUDA_KERNELS[op], op): fn for op, fn in impls.items()
    }
    out[(CUDA_ROTARY_MROPE, "rotary")] = rotary_mrope
    return out

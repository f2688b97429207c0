"""Torch kernels of the vision ops (`torch.<op>` in cpu plans; signatures in
ninfer/ir/ops_vision.py). Like ninfer.runtime.executors.cpu.ops: `fn(ctx, attrs, *inputs)`.

The vision stage runs with a `VisionContext` (the item's attention segments); `media_merge`
runs in the step with the step's context. The 2-D rotary runs in float32, as the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class VisionContext:
    """One run of the vision stage: `segments` (first row, rows) that attend among themselves
    (one per image / video frame)."""

    segments: tuple[tuple[int, int], ...]
    memo: dict[Any, Any] = field(default_factory=dict)


def media_merge(ctx: Any, a: dict, x: torch.Tensor, emb: torch.Tensor, rows: torch.Tensor):
    if rows.numel() == 0:
        return x
    return x.index_copy(0, rows.long(), emb.to(x.dtype))


def patch_embed(ctx: Any, a: dict, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    return F.linear(x.to(w.dtype), w.reshape(w.shape[0], -1), b)


def pos_embed_interp(ctx: Any, a: dict, index: torch.Tensor, weight: torch.Tensor, table):
    # the taps weighted in float32 (the reference's f32 weights promote a bf16 table), then cast
    return (table[index.long()] * weight[:, :, None]).sum(1).to(table.dtype)


def layernorm(ctx: Any, a: dict, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    return F.layer_norm(x, (x.shape[-1],), w, b, a["eps"])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotary_2d(ctx: Any, a: dict, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
    """Per head: frequencies over head_dim / 2 (a quarter of the head each for row and column),
    angles [row freqs | column freqs] twice over the head, rotate-half, in float32."""
    d = a["head_dim"]
    key = ("rotary_2d", d, a["theta"])
    if key not in ctx.memo:
        half = d // 2
        inv = 1.0 / (a["theta"] ** (torch.arange(0, half, 2, dtype=torch.float) / half))
        freqs = pos[..., None].float() * inv.to(pos.device)  # [P, 2, d/4]
        angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)  # [P, d/2]
        emb = torch.cat([angles, angles], dim=-1)[:, None, :]  # [P, 1, d]
        ctx.memo[key] = emb.cos(), emb.sin()
    cos, sin = ctx.memo[key]

    def rot(x: torch.Tensor) -> torch.Tensor:
        xf = x.float().unflatten(-1, (-1, d))  # [P, heads, d]
        return (xf * cos + _rotate_half(xf) * sin).to(x.dtype).flatten(-2)

    return rot(q), rot(k)


def vision_attention(ctx: Any, a: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    h, d = a["heads"], a["head_dim"]
    out = torch.empty_like(q)
    for begin, n in ctx.segments:
        rows = slice(begin, begin + n)
        qs, ks, vs = (t[rows].reshape(n, h, d).transpose(0, 1)[None] for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=a["scale"])  # [1, H, n, D]
        out[rows] = o[0].transpose(0, 1).reshape(n, h * d)
    return out


def gelu(ctx: Any, a: dict, x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate=a["approximate"])


def merge_rows(ctx: Any, a: dict, x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1] * a["rows_per_token"])


VISION_OPS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        media_merge,
        patch_embed,
        pos_embed_interp,
        layernorm,
        rotary_2d,
        vision_attention,
        gelu,
        merge_rows,
    )
}

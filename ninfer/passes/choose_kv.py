"""Choose the KV cache dtype and page layout, and describe the recurrent-state slots.

KV storage per token, per attention layer, per KV head (D = head_dim):

    f32    K, V: D * 4 bytes
    bf16   K, V: D * 2 bytes
    int8   K, V: D int8 + 1 f32 scale (symmetric, absmax / 127)
    fp8    K, V: D e4m3 + 1 f32 scale (absmax / 448)
    nvfp4  K, V: D/2 bytes of e2m1 pairs + D/16 e4m3 block scales + 1 f32 scale
    k8v4   K as fp8, V as nvfp4

Page layout: `[num_pages, page_size, kv_heads, D]` per layer for K and for V (plus the scale
arrays with the last dim replaced), so the positions of a page are contiguous. The default is
the compute dtype on cpu (the reference stays exact) and bf16 on cuda.
"""

from __future__ import annotations

from typing import Any

from ninfer.errors import ConfigError
from ninfer.ir.graph import Graph
from ninfer.ir.kv_formats import PLAIN_KV_FORMATS, split_kv
from ninfer.ir.types import DTYPE_BYTES
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def token_bytes(fmt: str, head_dim: int) -> int:
    """Bytes one KV head of one token takes in storage format `fmt` (one of K or V)."""
    if fmt in PLAIN_KV_FORMATS:
        return head_dim * DTYPE_BYTES[fmt]
    if fmt in ("int8", "fp8"):
        return head_dim + 4
    if fmt == "nvfp4":
        return head_dim // 2 + head_dim // 16 + 4
    raise ValueError(fmt)


def _layout(fmt: str, kv_heads: int, head_dim: int) -> str:
    base = f"[pages, page_size, {kv_heads}, {head_dim}]"
    if fmt in PLAIN_KV_FORMATS:
        return f"{fmt}{base}"
    if fmt == "nvfp4":
        return f"u8[pages, page_size, {kv_heads}, {head_dim // 2}] + e4m3[.., {head_dim // 16}] + f32[.., 1]"
    return f"{'i8' if fmt == 'int8' else 'e4m3'}{base} + f32[pages, page_size, {kv_heads}]"


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    kv_dtype = options.kv_dtype or (g.meta["dtype"] if options.device == "cpu" else "bf16")
    caches = g.meta["caches"]
    kv_layers = [c for c in caches.values() if c["kind"] == "kv"]
    state_layers = [c for c in caches.values() if c["kind"] == "state"]
    k_fmt, v_fmt = split_kv(kv_dtype)
    kv: dict[str, Any] = {
        "dtype": kv_dtype,
        "page_size": options.page_size,
        "layers": [c["layer"] for c in kv_layers],
    }
    if kv_layers:
        heads = {(c["kv_heads"], c["head_dim"]) for c in kv_layers}
        if len(heads) != 1:
            raise ValueError(f"attention layers disagree on KV shape: {sorted(heads)}")
        kv_heads, head_dim = heads.pop()
        if "nvfp4" in (k_fmt, v_fmt) and head_dim % 16:
            raise ConfigError(
                f"--kv-dtype {kv_dtype}: needs head_dim a multiple of 16, this model has {head_dim}"
            )
        per_layer = kv_heads * (token_bytes(k_fmt, head_dim) + token_bytes(v_fmt, head_dim))
        kv.update(
            kv_heads=kv_heads,
            head_dim=head_dim,
            k_layout=_layout(k_fmt, kv_heads, head_dim),
            v_layout=_layout(v_fmt, kv_heads, head_dim),
            bytes_per_token=per_layer * len(kv_layers),
            bytes_per_page=per_layer * len(kv_layers) * options.page_size,
        )
    else:
        kv.update(bytes_per_token=0, bytes_per_page=0)
    act = DTYPE_BYTES[g.meta["dtype"]]
    slot_bytes = sum(
        c["conv_dim"] * (c["kernel_size"] - 1) * act + c["v_heads"] * c["k_dim"] * c["v_dim"] * 4
        for c in state_layers
    )
    g.meta["kv"] = kv
    g.meta["state"] = {
        "layers": [c["layer"] for c in state_layers],
        "slots": options.state_slots if state_layers else 0,
        "bytes_per_slot": slot_bytes,
        "layout": "conv tail [slots, conv_dim, kernel-1] + f32 S [slots, v_heads, k_dim, v_dim] per linear layer",
    }
    for op in g.ops:
        if op.kind == "attention":
            op.attrs["kv_dtype"] = kv_dtype
    return g


CHOOSE_KV = Pass("choose_kv", _run, "KV dtype and page layout; recurrent-state slots")

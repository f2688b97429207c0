"""Qwen3.5 hybrid, dense and MoE.

Layers are Gated DeltaNet (linear attention) or gated full attention as `layer_types` says.
Full attention: q_proj emits per head query|gate, zero-centred q/k norm, rotary on the first
partial_rotary_factor of each head, output * sigmoid(gate). Every RMSNorm is zero-centred except
the DeltaNet output norm (gated, plain weight). MoE layers add a shared expert gated by
sigmoid(shared_expert_gate h); the router always renormalises. An MTP head is declared in
`meta["declared"]` (the `--spec mtp` drafter runs it as its own plan: ir/models/mtp.py); so is
the vision tower, unless the graph is built `vision=True`: then it runs (qwen3_5_vision.py) and the text rotary is 3-axis (MRoPE).
"""

from __future__ import annotations

import dataclasses

from ninfer.artifact.model_spec import ModelSpec
from ninfer.ir.builder import GraphBuilder, TensorTable
from ninfer.ir.graph import Graph
from ninfer.ir.models import blocks
from ninfer.ir.models.decoder import build_decoder
from ninfer.ir.models.qwen3_5_vision import build_vision, mrope_axes, vision_spec


def _mixer(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    if s.layer_types[i] == "linear_attention":
        return blocks.gated_deltanet(b, s, i, h)
    return blocks.attention(b, s, i, h, qk_norm=True, gated=True, zero_centered=True)


def _ffn(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    if s.experts:
        return blocks.moe(b, s, i, h, shared=s.shared_inter > 0)
    return blocks.mlp(b, s, f"model.layers.{i}.mlp", f"L{i}", h, intermediate_size=s.inter)


def build(
    s: ModelSpec,
    tensors: TensorTable,
    dtype: str,
    config: dict | None = None,
    vision: bool = False,
) -> Graph:
    """`vision`: run the tower (`config`: the artifact's config, holding vision_config)."""
    declared = {}  # an MTP head is declared by build_graph (run as its own plan by --spec mtp)
    if not vision:
        if any(t.startswith("visual.") for t in tensors):
            declared["vision"] = "declared, not executed"
        return build_decoder(s, tensors, dtype, _mixer, _ffn, zero_centered=True, declared=declared)
    cfg = config or {}
    v = vision_spec(cfg, s.hidden)
    s = dataclasses.replace(s, rope={**s.rope, "mrope_axes": mrope_axes(cfg, s.rotary_dim)})
    g = build_decoder(
        s,
        tensors,
        dtype,
        _mixer,
        _ffn,
        zero_centered=True,
        declared=declared,
        vision=lambda b: build_vision(b, v),
    )
    g.meta["vision"] = v.layout()
    return g

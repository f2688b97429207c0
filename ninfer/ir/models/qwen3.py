"""Qwen3 dense and Qwen3-MoE: Llama plus per-head RMSNorm on q and k before rotary; MoE layers
route with a softmax over all experts, top-k, renormalised when norm_topk_prob."""

from __future__ import annotations

from ninfer.artifact.model_spec import ModelSpec
from ninfer.ir.builder import GraphBuilder, TensorTable
from ninfer.ir.graph import Graph
from ninfer.ir.models import blocks
from ninfer.ir.models.decoder import build_decoder


def _mixer(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    return blocks.attention(b, s, i, h, qk_norm=True, gated=False, zero_centered=False)


def _ffn(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    if s.experts and s.sparse_layers[i]:
        return blocks.moe(b, s, i, h, shared=False)
    return blocks.mlp(b, s, f"model.layers.{i}.mlp", f"L{i}", h, intermediate_size=s.inter)


def build(s: ModelSpec, tensors: TensorTable, dtype: str) -> Graph:
    return build_decoder(s, tensors, dtype, _mixer, _ffn, zero_centered=False)

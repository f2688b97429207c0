"""Qwen2 / Qwen2.5: Llama with a bias on the q, k and v projections (none on o_proj, none in
the MLP) and no q/k norm; rotary theta, and a tied or untied head, from the config."""

from __future__ import annotations

from ninfer.artifact.model_spec import ModelSpec
from ninfer.ir.builder import GraphBuilder, TensorTable
from ninfer.ir.graph import Graph
from ninfer.ir.models import blocks
from ninfer.ir.models.decoder import build_decoder


def _mixer(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    return blocks.attention(
        b, s, i, h, qk_norm=False, gated=False, zero_centered=False, qkv_bias=True
    )


def _ffn(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    return blocks.mlp(b, s, f"model.layers.{i}.mlp", f"L{i}", h, intermediate_size=s.inter)


def build(s: ModelSpec, tensors: TensorTable, dtype: str) -> Graph:
    return build_decoder(s, tensors, dtype, _mixer, _ffn, zero_centered=False)

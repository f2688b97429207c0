"""Llama (and SmolLM2): plain RMSNorm, rotate-half rotary over the full head, SwiGLU MLP."""

from __future__ import annotations

from ninfer.artifact.model_spec import ModelSpec
from ninfer.ir.builder import GraphBuilder, TensorTable
from ninfer.ir.graph import Graph
from ninfer.ir.models import blocks
from ninfer.ir.models.decoder import build_decoder


def _mixer(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    return blocks.attention(b, s, i, h, qk_norm=False, gated=False, zero_centered=False)


def _ffn(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    return blocks.mlp(
        b, s, f"model.layers.{i}.mlp", f"L{i}", h, s.mlp_bias, intermediate_size=s.inter
    )


def build(s: ModelSpec, tensors: TensorTable, dtype: str) -> Graph:
    return build_decoder(s, tensors, dtype, _mixer, _ffn, zero_centered=False)

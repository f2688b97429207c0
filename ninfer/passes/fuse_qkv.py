"""Fuse the Q, K and V projections of attention into one GEMM (and the four input projections
of Gated DeltaNet — qkv, z, b, a — likewise: one read of the hidden state instead of several).
"""

from __future__ import annotations

from ninfer.ir.graph import Graph
from ninfer.passes.base import Pass
from ninfer.passes.fusion import fuse_linear_groups
from ninfer.passes.options import CompileOptions


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    n = fuse_linear_groups(g, ("q", "k", "v"), ".attn_in")
    n += fuse_linear_groups(g, ("qkv", "z", "b", "a"), ".gdn_in")
    g.meta.setdefault("fusions", {})["fuse_qkv"] = n
    return g


FUSE_QKV = Pass("fuse_qkv", _run, "q/k/v (and DeltaNet qkv/z/b/a) projections -> one GEMM + split")

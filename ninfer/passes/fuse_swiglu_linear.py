"""Fold the SwiGLU activation into the projection that reads it (an MLP's down projection):

    %act = swiglu(%gu)                  ==>      %y = linear(%gu, @down_proj) {act=swiglu}
    %y = linear(%act, @down_proj)

`linear` with attr act=swiglu computes silu(x[..., :K]) * x[..., K:] @ wᵀ for a [N, K] weight
(input width 2K). The CUDA runtime's decode GEMV (kernels/gemv.py) computes the activation in
registers as it streams the weight, so a decode step has one launch and one round trip of the
[T, I] activation fewer per MLP; other paths apply the activation first, as before. The fold
happens only when the activation is read by that one linear and is no graph output.
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    users, prod = g.users(), g.producer()
    drop: set[int] = set()
    for i, op in enumerate(g.ops):
        if op.kind != "linear" or "act" in op.attrs:
            continue
        j = prod.get(op.inputs[0])
        if j is None or g.ops[j].kind != "swiglu":
            continue
        act = op.inputs[0]
        if users.get(act) != [i] or act in g.outputs:
            continue
        gu = g.ops[j].inputs[0]
        g.ops[i] = Op(
            "linear", (gu, *op.inputs[1:]), op.outputs, {**op.attrs, "act": "swiglu"}, op.kernel
        )
        drop.add(j)
        del g.values[act]
    g.ops = [op for k, op in enumerate(g.ops) if k not in drop]
    g.meta.setdefault("fusions", {})["fuse_swiglu_linear"] = len(drop)
    return g


FUSE_SWIGLU_LINEAR = Pass(
    "fuse_swiglu_linear", _run, "swiglu folded into the linear that reads it (down projection)"
)

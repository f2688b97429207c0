"""Fuse a residual add with the RMSNorm that reads its sum (one pass over the hidden state).

%s = add(%x, %a)                            %h, %s = add_rmsnorm(%x, %a, @w)
%h = rmsnorm(%s, @w)              ==>
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    users = g.users()
    prod = g.producer()
    drop: set[int] = set()
    n = 0
    for i, op in enumerate(g.ops):
        if op.kind != "rmsnorm" or op.attrs.get("head_dim"):
            continue
        j = prod.get(op.inputs[0])
        if j is None or g.ops[j].kind != "add" or j in drop:
            continue
        norms = [k for k in users[op.inputs[0]] if g.ops[k].kind == "rmsnorm"]
        if norms != [i]:
            continue
        add = g.ops[j]
        attrs = {"eps": op.attrs["eps"], "zero_centered": op.attrs["zero_centered"]}
        g.ops[j] = Op(
            "add_rmsnorm", (*add.inputs, op.inputs[1]), (op.outputs[0], add.outputs[0]), attrs
        )
        drop.add(i)
        n += 1
    g.ops = [op for k, op in enumerate(g.ops) if k not in drop]
    g.meta.setdefault("fusions", {})["fuse_residual_norm"] = n
    return g


FUSE_RESIDUAL_NORM = Pass(
    "fuse_residual_norm", _run, "residual add + following RMSNorm -> add_rmsnorm"
)

"""Fuse the gate and up projections of every SwiGLU MLP into one GEMM feeding `swiglu`, and the
gate/up expert weights of MoE layers into one [E, 2I, H] weight.

    %g = linear(%h, @gate_proj)                 %gu = linear(%h, @gate_proj+up_proj)
    %u = linear(%h, @up_proj)          ==>      %act = swiglu(%gu)
    %act = silu_mul(%g, %u)
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op, Weight
from ninfer.ir.types import TensorType
from ninfer.passes.base import Pass
from ninfer.passes.fusion import fuse_linear_groups
from ninfer.passes.options import CompileOptions


def _splits_to_swiglu(g: Graph) -> None:
    """silu_mul(a, b) where a, b are the two halves of one split used nowhere else -> swiglu."""
    users = g.users()
    prod = g.producer()
    drop: set[int] = set()
    for i, op in enumerate(g.ops):
        if op.kind != "silu_mul":
            continue
        a, b = op.inputs
        j = prod.get(a)
        if j is None or j != prod.get(b):
            continue
        split = g.ops[j]
        if (
            split.kind != "split"
            or split.outputs != (a, b)
            or len(users[a]) != 1
            or len(users[b]) != 1
        ):
            continue
        g.ops[i] = Op("swiglu", split.inputs, op.outputs, {})
        drop.add(j)
        del g.values[a], g.values[b]
    g.ops = [op for k, op in enumerate(g.ops) if k not in drop]


def _fuse_experts(g: Graph) -> int:
    n = 0
    for i, op in enumerate(g.ops):
        if op.kind != "moe_experts":
            continue
        x, tw, ti, wg, wu, wd = op.inputs
        gate, up = g.weights[wg], g.weights[wu]
        if gate.format != up.format or gate.layout != "stack" or up.layout != "stack":
            continue
        e, inter, h = gate.type.shape
        name = wg.replace(".gate_proj.", ".gate_up_proj.")
        t = TensorType(gate.type.dtype, (e, 2 * inter, h))
        shards = gate.shards + up.shards  # both sharded alike (tensor parallelism) or neither
        g.weights[name] = Weight(
            name, t, gate.format, gate.sources + up.sources, "stack_concat", shards
        )
        del g.weights[wg], g.weights[wu]
        g.ops[i] = Op("moe_experts_gu", (x, tw, ti, name, wd), op.outputs, dict(op.attrs))
        n += 1
    return n


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    n = fuse_linear_groups(g, ("gate", "up"), ".mlp_in")
    _splits_to_swiglu(g)
    n += _fuse_experts(g)
    g.meta.setdefault("fusions", {})["fuse_gate_up"] = n
    return g


FUSE_GATE_UP = Pass(
    "fuse_gate_up", _run, "gate/up projections (and expert gate/up) -> one GEMM + swiglu"
)

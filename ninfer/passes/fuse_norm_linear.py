"""Let an RMSNorm between two fp8 / nvfp4 projections run inside them (CUDA decode at batch 1):

    %y = linear(%x, @o_proj)                   %y = linear(%x, @o_proj) {residual_norm}
    %n, %s = add_rmsnorm(%r, %y, @g)    ==>    %n, %s = add_rmsnorm(%r, %y, @g) {stats_slot=k}
    %z = linear(%n, @gate_up)                  %z = linear(%n, @gate_up)

The graph computes the same function; the attributes say the three may run as two launches.
Where the CUDA runtime can (one row of x, fp8 or nvfp4 weights the tensor-core GEMV takes,
kernels/fp8_mma.py), the first projection's epilogue adds the residual, writes s = y + r, a
half-precision copy of s * g and this program's share of the sum of s² (into stats slot k, zeroed
at the start of every step), and the second projection reads that copy and scales its row sums by
1 / rms(s): the norm's own launch, one of ~72 per Qwen3-8B decode step that each sit on the
critical path between two GEMVs, is gone. Elsewhere (batch > 1, other kernels) each op runs as
written. Marked only where the first projection's output (either operand of the add) has no
other reader and the norm's output feeds one such linear without an activation on its input; the
residual sum %s may have any readers.
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _mma_linear(g: Graph, op: Op) -> bool:
    """A linear of an fp8 or nvfp4 weight (the formats the tensor-core GEMV takes)."""
    if op.kind != "linear" or len(op.inputs) != 2 or "act" in op.attrs:
        return False
    w = g.weights.get(op.inputs[1])
    return w is not None and w.format in ("fp8", "nvfp4")


def _produces(g: Graph, i: int | None, j: int, users: dict) -> bool:
    """Whether op i is an fp8 / nvfp4 projection whose output only op j reads."""
    if i is None or not _mma_linear(g, g.ops[i]) or "out" in g.ops[i].attrs:
        return False
    y = g.ops[i].outputs[0]
    return users.get(y) == [j] and y not in g.outputs


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    users, prod = g.users(), g.producer()
    slots = 0
    for j, op in enumerate(g.ops):
        if op.kind != "add_rmsnorm":
            continue
        n = op.outputs[0]
        i = next((i for i in map(prod.get, op.inputs[:2]) if _produces(g, i, j, users)), None)
        if i is None or n in g.outputs:
            continue
        first = g.ops[i]
        readers = users.get(n, [])
        if len(readers) != 1 or not _mma_linear(g, g.ops[readers[0]]):
            continue
        if g.ops[readers[0]].inputs[0] != n:
            continue
        g.ops[i] = Op(first.kind, first.inputs, first.outputs,
                      {**first.attrs, "residual_norm": True}, first.kernel)  # fmt: skip
        g.ops[j] = Op(op.kind, op.inputs, op.outputs, {**op.attrs, "stats_slot": slots},
                      op.kernel)  # fmt: skip
        slots += 1
    g.meta.setdefault("fusions", {})["fuse_norm_linear"] = slots
    return g


FUSE_NORM_LINEAR = Pass(
    "fuse_norm_linear",
    _run,
    "RMSNorm between two fp8 / nvfp4 projections marked to run in their epilogue / prologue (cuda)",
)

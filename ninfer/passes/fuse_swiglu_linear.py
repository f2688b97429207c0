"""Fold the SwiGLU activation into a projection beside it, whichever reads or writes it cheaper:

    %gu = linear(%h, @gate_up)          ==>      %act = linear(%h, @gate_up) {out=swiglu}
    %act = swiglu(%gu)                  (fp8, nvfp4 weights)
    %y = linear(%act, @down_proj)       ==>      %y = linear(%gu, @down_proj) {act=swiglu}
                                        (other formats)

`linear` with attr act=swiglu computes silu(x[..., :K]) * x[..., K:] @ wᵀ for a [N, K] weight
(input width 2K): the CUDA runtime's decode GEMVs (kernels/gemv.py, kernels/fp8_gemv.py)
compute the activation in registers as they stream the down weight. With out=swiglu the weight
is [gate; up] ([2I, K]) and the result silu(y[..., :I]) * y[..., I:]: the fp8 tensor-core GEMV
(kernels/fp8_mma.py) and the nvfp4 GEMV (kernels/nvfp4_gemv.py) pair each gate row with its up
row and write the activation, so the down projection reads I values instead of recomputing
silu(gate) * up from 2I in every program (which costs the fp8 one ~14 % at batch 1 on the
H200; the nvfp4 GEMV has no activation fold and ran the silu_mul kernel before it). Either way
a decode step has one launch and one round trip of the [T, 2I] activation fewer per MLP; paths
that cannot fold apply the activation as a separate step. The fold happens only when the values involved have no other reader and are
no graph output, and into gate/up only without a bias.
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions

# weight formats whose gate/up projection takes the activation as its epilogue
EPILOGUE_FORMATS = ("fp8", "nvfp4")


def _into_gate_up(g: Graph, j: int, users: dict, prod: dict) -> int | None:
    """Index of the gate/up linear that can take swiglu op j as its epilogue, or None."""
    gu = g.ops[j].inputs[0]
    k = prod.get(gu)
    if k is None or users.get(gu) != [j] or gu in g.outputs:
        return None
    op = g.ops[k]
    if op.kind != "linear" or len(op.inputs) != 2 or "act" in op.attrs or "out" in op.attrs:
        return None
    w = g.weights.get(op.inputs[1])
    return k if w is not None and w.format in EPILOGUE_FORMATS else None


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    users, prod = g.users(), g.producer()
    drop: set[int] = set()
    for j, op in enumerate(g.ops):
        if op.kind != "swiglu":
            continue
        k = _into_gate_up(g, j, users, prod)
        if k is not None:
            gate_up = g.ops[k]
            g.ops[k] = Op("linear", gate_up.inputs, op.outputs, {**gate_up.attrs, "out": "swiglu"},
                          gate_up.kernel)  # fmt: skip
            drop.add(j)
            del g.values[op.inputs[0]]
            continue
        act = op.outputs[0]
        readers = users.get(act, [])
        if len(readers) != 1 or act in g.outputs:
            continue
        i = readers[0]
        down = g.ops[i]
        if down.kind != "linear" or "act" in down.attrs or down.inputs[0] != act:
            continue
        g.ops[i] = Op("linear", (op.inputs[0], *down.inputs[1:]), down.outputs,
                      {**down.attrs, "act": "swiglu"}, down.kernel)  # fmt: skip
        drop.add(j)
        del g.values[act]
    g.ops = [op for k, op in enumerate(g.ops) if k not in drop]
    g.meta.setdefault("fusions", {})["fuse_swiglu_linear"] = len(drop)
    return g


FUSE_SWIGLU_LINEAR = Pass(
    "fuse_swiglu_linear",
    _run,
    "swiglu folded into the linear beside it (gate/up for fp8 and nvfp4 weights, else down)",
)

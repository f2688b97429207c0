"""Fold the attention prologue (per-head q/k RMSNorm, rotary) into the attention op, so the
CUDA plan runs it as one kernel together with the KV-cache write (kernels/attn_prologue.py).

    %qn = rmsnorm(%q, @q_norm) {head_dim}
    %kn = rmsnorm(%k, @k_norm) {head_dim}          %o = attention(%q, %k, %v, %positions,
    %qr, %kr = rotary(%qn, %kn, %positions)   ==>                 @q_norm, @k_norm)
    %o = attention(%qr, %kr, %v)                        {prologue=qk_norm+rotary, rope,
                                                         rotary_dim, eps, zero_centered, ...}

Without the two norms (Llama) the prologue is `rotary` and the inputs stop at %positions. The
fold happens only when every folded value (%qn, %kn, %qr, %kr) is read by the next op of the
chain alone and is no graph output; norms that do not both qualify stay as ops. The attention's
attrs take the rotary's `rope` / `rotary_dim` and the norms' `eps` / `zero_centered`, the names
those ops use, so a runtime can apply them with the same functions. Rotary over multimodal
(3-axis) positions (a rope with `mrope_axes`, --vision) folds on cpu only, whose attention
reads positions [3, T]; a cuda plan keeps it a `rotary` op (torch.rotary_mrope) and its norms
separate ops, since the one-launch Triton prologue takes positions [T].
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _sole_reader(g: Graph, users: dict[str, list[int]], name: str, reader: int) -> bool:
    return users.get(name) == [reader] and name not in g.outputs


def _qk_norms(
    g: Graph, users: dict[str, list[int]], prod: dict[str, int], rot_index: int, head_dim: int
) -> tuple[int, int] | None:
    """Indices of the q and k per-head norms feeding rotary op `rot_index`, when both fold."""
    rot = g.ops[rot_index]
    idx = [prod.get(rot.inputs[0]), prod.get(rot.inputs[1])]
    if None in idx or idx[0] == idx[1]:
        return None
    ops = [g.ops[i] for i in idx]
    if any(o.kind != "rmsnorm" or o.attrs.get("head_dim") != head_dim for o in ops):
        return None
    if any(ops[0].attrs[a] != ops[1].attrs[a] for a in ("eps", "zero_centered")):
        return None
    if not all(_sole_reader(g, users, o.outputs[0], rot_index) for o in ops):
        return None
    return idx[0], idx[1]


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    users, prod = g.users(), g.producer()
    drop: set[int] = set()
    n = 0
    for i, op in enumerate(g.ops):
        if op.kind != "attention" or "prologue" in op.attrs:
            continue
        r = prod.get(op.inputs[0])
        if r is None or g.ops[r].kind != "rotary" or g.ops[r].outputs != op.inputs[:2]:
            continue
        rot, hd = g.ops[r], op.attrs["head_dim"]
        if rot.attrs["head_dim"] != hd:
            continue
        if "mrope_axes" in rot.attrs["rope"] and options.device != "cpu":
            continue
        if not all(_sole_reader(g, users, name, i) for name in rot.outputs):
            continue
        q, k, pos = rot.inputs
        v = op.inputs[2]
        attrs = dict(op.attrs, prologue="rotary", rope=rot.attrs["rope"])
        attrs["rotary_dim"] = rot.attrs["rotary_dim"]
        inputs: tuple[str, ...] = (q, k, v, pos)
        norms = _qk_norms(g, users, prod, r, hd)
        if norms is not None:
            qn, kn = g.ops[norms[0]], g.ops[norms[1]]
            inputs = (qn.inputs[0], kn.inputs[0], v, pos, qn.inputs[1], kn.inputs[1])
            attrs.update(
                prologue="qk_norm+rotary",
                eps=qn.attrs["eps"],
                zero_centered=qn.attrs["zero_centered"],
            )
            drop.update(norms)
        g.ops[i] = Op("attention", inputs, op.outputs, attrs, op.kernel)
        drop.add(r)
        n += 1
    for j in drop:
        for name in g.ops[j].outputs:
            del g.values[name]
    g.ops = [op for j, op in enumerate(g.ops) if j not in drop]
    g.meta.setdefault("fusions", {})["fuse_attention_prologue"] = n
    return g


FUSE_ATTENTION_PROLOGUE = Pass(
    "fuse_attention_prologue",
    _run,
    "per-head q/k rmsnorm + rotary folded into attention (one kernel with the KV write)",
)

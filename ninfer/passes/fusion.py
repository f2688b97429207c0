"""Shared rewrite: fuse sibling linear ops (same input, same storage format) into one GEMM.

    %q = linear(%h, @q_proj)           %L0.attn_in = linear(%h, @q_proj+k_proj+v_proj)
    %k = linear(%h, @k_proj)    ==>    %q, %k, %v = split(%L0.attn_in) {sizes=[Nq,Nk,Nv]}
    %v = linear(%h, @v_proj)

The fused weight concatenates its sources along N (layout "concat"); fp8 keeps its per-row
scales, nvfp4 keeps one global scale per source segment (`segments` of the weight).
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op, Weight
from ninfer.ir.types import TensorType


def _fused_weight_name(names: list[str]) -> str:
    parts = [n.removesuffix(".weight").removesuffix(".bias") for n in names]
    suffix = ".weight" if names[0].endswith(".weight") else ".bias"
    prefix = parts[0].rsplit(".", 1)[0]
    leaves = [p.rsplit(".", 1)[1] for p in parts]
    return f"{prefix}.{'+'.join(leaves)}{suffix}"


def _concat_weight(graph: Graph, names: list[str]) -> str | None:
    ws = [graph.weights[n] for n in names]
    if any(w.layout != "plain" for w in ws) or len({w.format for w in ws}) != 1:
        return None
    if len({w.type.shape[1:] for w in ws}) != 1:
        return None
    name = _fused_weight_name(names)
    rows = sum(w.type.shape[0] for w in ws)
    t = TensorType(ws[0].type.dtype, (rows, *ws[0].type.shape[1:]))
    shards = tuple(w.shards[0] if w.shards else None for w in ws)  # tensor parallelism
    graph.weights[name] = Weight(
        name,
        t,
        ws[0].format,
        tuple(w.sources[0] for w in ws),
        "concat",
        shards if any(shards) else (),
    )
    return name


def fuse_linear_groups(graph: Graph, roles: tuple[str, ...], group_suffix: str) -> int:
    """Fuse, in place, every group of linear ops whose `group` attr ends with `group_suffix`
    and whose `proj` attrs are exactly `roles` (in order). Returns the number of GEMMs made."""
    groups: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        if op.kind == "linear" and str(op.attrs.get("group", "")).endswith(group_suffix):
            groups.setdefault(op.attrs["group"], []).append(i)
    replace: dict[int, list[Op]] = {}  # first op index -> linear + split
    drop: set[int] = set()
    for group, idx in groups.items():
        ops = [graph.ops[i] for i in idx]
        if tuple(o.attrs["proj"] for o in ops) != roles or len({o.inputs[0] for o in ops}) != 1:
            continue
        if len({len(o.inputs) for o in ops}) != 1:
            continue  # some with bias, some without
        w = _concat_weight(graph, [o.inputs[1] for o in ops])
        if w is None:
            continue
        inputs = [ops[0].inputs[0], w]
        if len(ops[0].inputs) == 3:
            bias = _concat_weight(graph, [o.inputs[2] for o in ops])
            if bias is None:
                del graph.weights[w]
                continue
            inputs.append(bias)
        sizes = [graph.values[o.outputs[0]].shape[-1] for o in ops]
        y = graph.values[ops[0].outputs[0]]
        graph.values[group] = y.with_shape(*y.shape[:-1], sum(sizes))
        replace[idx[0]] = [
            Op("linear", tuple(inputs), (group,), {"group": group, "proj": "+".join(roles)}),
            Op("split", (group,), tuple(o.outputs[0] for o in ops), {"sizes": sizes}),
        ]
        drop.update(idx[1:])
        for o in ops:
            for n in o.inputs[1:]:
                graph.weights.pop(n, None)
    new_ops: list[Op] = []
    for i, op in enumerate(graph.ops):
        if i in replace:
            new_ops.extend(replace[i])
        elif i not in drop:
            new_ops.append(op)
    graph.ops = new_ops
    return len(replace)

"""A stable text form of a graph: same graph, same text (CI snapshot-tests it).

graph qwen3 (f32)
  input %tokens: i32[T]
  weight @model.layers.0.self_attn.qkv_proj.weight: f32[192,64] bf16 concat(3)
  %L0.qkv = linear(%L0.x, @model.layers.0.self_attn.qkv_proj.weight) : f32[T,192]  [torch.linear]
  output %logits
"""

from __future__ import annotations

import json
from typing import Any

from ninfer.ir.graph import Graph, Op


def format_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def format_attrs(attrs: dict[str, Any]) -> str:
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k}={format_attr(attrs[k])}" for k in sorted(attrs)) + "}"


def _ref(graph: Graph, name: str) -> str:
    return ("@" if name in graph.weights else "%") + name


def format_op(graph: Graph, op: Op) -> str:
    outs = ", ".join("%" + o for o in op.outputs)
    args = ", ".join(_ref(graph, n) for n in op.inputs)
    types = ", ".join(str(graph.values[o]) for o in op.outputs)
    kernel = f"  [{op.kernel}]" if op.kernel else ""
    return f"{outs} = {op.kind}({args}){format_attrs(op.attrs)} : {types}{kernel}"


def _shards(shards: tuple) -> str:
    """` shard dim=0 1/2 segments=[..]` per distinct source shard of a rank's weight."""
    text = []
    for s in dict.fromkeys(shards):
        if s is None:
            text.append("whole")
            continue
        seg = f" segments={list(s.segments)}" if s.segments else ""
        text.append(f"dim={s.dim} {s.index}/{s.parts}{seg}")
    return " shard " + " | ".join(text) if text else ""


def print_graph(graph: Graph, weights: bool = True) -> str:
    """The graph as text. `weights=False` leaves out the weight table (shorter pass dumps)."""
    lines = [f"graph {graph.name} ({graph.meta.get('dtype', '?')})"]
    for name, t in graph.inputs.items():
        lines.append(f"  input %{name}: {t}")
    if weights:
        for name, w in graph.weights.items():
            how = w.layout if w.layout == "plain" else f"{w.layout}({len(w.sources)})"
            lines.append(f"  weight @{name}: {w.type} {w.format} {how}{_shards(w.shards)}")
    for name, c in graph.meta.get("caches", {}).items():
        lines.append(f"  cache {name}: {format_attr(c)}")
    for op in graph.ops:
        lines.append("  " + format_op(graph, op))
    for name in graph.outputs:
        lines.append(f"  output %{name}")
    return "\n".join(lines) + "\n"

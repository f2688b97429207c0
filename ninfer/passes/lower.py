"""The last phase: lower a kernel-assigned graph to an execution plan (ninfer.ir.plan.Plan).

Every op becomes one KernelCall in graph order; inputs, weights and op outputs become named
buffers; the decisions of earlier phases (kv, state, ledger, buckets, fusions) are copied in.
"""

from __future__ import annotations

from dataclasses import asdict

from ninfer.ir.graph import Graph
from ninfer.ir.plan import BufferSpec, KernelCall, Plan
from ninfer.passes.options import CompileOptions


def lower(graph: Graph, options: CompileOptions) -> Plan:
    if not graph.meta.get("kernels_assigned"):
        raise ValueError("lower: kernels are not assigned yet")
    buffers: dict[str, BufferSpec] = {}
    for name, t in graph.inputs.items():
        buffers[name] = BufferSpec(name, "input", str(t))
    order: dict[str, int] = {}
    for n in (n for op in graph.ops for n in op.inputs if n in graph.weights):
        order.setdefault(n, len(order))
    for name in sorted(graph.weights, key=lambda n: order.get(n, len(order))):  # by first use
        w = graph.weights[name]
        buffers[name] = BufferSpec(name, "weight", str(w.type), w.format, w.sources, w.layout)
    for name, t in graph.values.items():
        buffers[name] = BufferSpec(name, "activation", str(t))
    calls = []
    for op in graph.ops:
        attrs = {k: v for k, v in op.attrs.items() if k not in ("group", "proj")}
        calls.append(KernelCall(op.kernel or "", op.kind, op.inputs, op.outputs, attrs))
    meta = graph.meta
    model = {
        k: meta[k] for k in ("vocab", "hidden", "layer_types", "hybrid", "declared", "max_position")
    }
    opts = {k: v for k, v in asdict(options).items() if k not in ("device",)}
    opts["cuda_graphs"] = options.cuda_graphs and options.device == "cuda"  # none on cpu
    opts["dtype"] = (
        options.dtype or {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[meta["dtype"]]
    )
    return Plan(
        name=meta.get("model_name", graph.name),
        architecture=meta["architecture"],
        device=options.device,
        dtype=meta["dtype"],
        options=opts,
        passes=list(meta.get("passes", [])) + ["lower"],
        fusions=dict(meta.get("fusions", {})),
        model=model,
        buffers=buffers,
        caches=dict(meta["caches"]),
        calls=calls,
        inputs=list(graph.inputs),
        outputs=list(graph.outputs),
        kv=dict(meta["kv"]),
        state=dict(meta["state"]),
        ledger=dict(meta["ledger"]),
        cuda_graph_buckets=list(meta.get("cuda_graph_buckets", [])),
    )

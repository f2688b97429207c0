"""The last phase: lower a kernel-assigned graph to an execution plan (ninfer.ir.plan.Plan).

Every op becomes one KernelCall in graph order; inputs, weights and op outputs become named
buffers; the decisions of earlier phases (kv, state, ledger, buckets, fusions) become the
plan's typed sections.
"""

from __future__ import annotations

from dataclasses import fields

from ninfer.ir.graph import Graph
from ninfer.ir.plan import (
    BufferSpec,
    KernelCall,
    Ledger,
    LedgerEntry,
    ParallelLayout,
    Plan,
    PlanOptions,
)
from ninfer.ir.plan_sections import kv_from_dict, state_from_dict, vision_from_dict
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
        buffers[name] = BufferSpec(
            name, "weight", str(w.type), w.format, w.sources, w.layout, w.shards
        )
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
    if meta.get("capture"):  # captured hidden states: name -> output (decoder.add_captures)
        model["capture"] = dict(meta["capture"])
    if meta.get("media"):  # a stage that merges another stage's vision embeddings (mtp.py)
        model["media"] = meta["media"]
    recorded = {f.name: getattr(options, f.name) for f in fields(PlanOptions)}
    recorded["cuda_graphs"] = options.cuda_graphs and options.device == "cuda"  # none on cpu
    recorded["dtype"] = (
        options.dtype or {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[meta["dtype"]]
    )
    ledger = meta["ledger"]
    return Plan(
        name=meta.get("model_name", graph.name),
        architecture=meta["architecture"],
        device=options.device,
        dtype=meta["dtype"],
        options=PlanOptions(**recorded),
        passes=list(meta.get("passes", [])) + ["lower"],
        fusions=dict(meta.get("fusions", {})),
        model=model,
        buffers=buffers,
        caches=dict(meta["caches"]),
        calls=calls,
        inputs=list(graph.inputs),
        outputs=list(graph.outputs),
        kv=kv_from_dict(meta["kv"]),
        state=state_from_dict(meta["state"]),
        ledger=Ledger(
            tuple(LedgerEntry(**e) for e in ledger["entries"]), ledger["total"], ledger["budget"]
        ),
        cuda_graph_buckets=tuple(meta.get("cuda_graph_buckets", [])),
        vision=vision_from_dict(meta.get("vision")),
        parallel=ParallelLayout(**meta["parallel"]) if "parallel" in meta else None,
    )

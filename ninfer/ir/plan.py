"""The execution plan: an ordered, serialisable list of kernel calls over named buffers, plus
the KV layout, the memory ledger and the CUDA Graph buckets.

This is the lowest level of the IR (what `passes/lower.py` produces, what `ninfer compile`
prints and what the runtime executes); it is plain data with a JSON round trip, so a plan can
be compiled on one machine and inspected or run on another. `ninfer.runtime.plan` re-exports it.

Buffers:
    input       step inputs bound per step (tokens, positions, logit_rows)
    weight      loaded once from the artifact (format, sources, layout say how)
    activation  values produced by calls within one step
Caches (`kv.L<i>`, `state.L<i>`) persist across steps; calls name them in `attrs["cache"]`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ninfer.ir.printer import format_attrs

PLAN_VERSION = 1


@dataclass(frozen=True)
class BufferSpec:
    name: str
    kind: str  # input | weight | activation
    type: str  # TensorType text, e.g. "f32[T,64]"
    format: str | None = None  # weights: storage format
    sources: tuple[str, ...] = ()  # weights: artifact tensors
    layout: str | None = None  # weights: plain | concat | stack | stack_concat


@dataclass(frozen=True)
class KernelCall:
    kernel: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    name: str
    architecture: str
    device: str
    dtype: str
    options: dict[str, Any]
    passes: list[str]
    fusions: dict[str, int]
    model: dict[str, Any]  # vocab, hidden, layer_types, hybrid, declared components
    buffers: dict[str, BufferSpec]
    caches: dict[str, dict[str, Any]]
    calls: list[KernelCall]
    inputs: list[str]
    outputs: list[str]
    kv: dict[str, Any]
    state: dict[str, Any]
    ledger: dict[str, Any]
    cuda_graph_buckets: list[int]
    version: int = PLAN_VERSION

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["buffers"] = [asdict(b) for b in self.buffers.values()]
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        if d.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version {d.get('version')} is not {PLAN_VERSION}")
        d = dict(d)
        d["buffers"] = {
            b["name"]: BufferSpec(**{**b, "sources": tuple(b.get("sources", ()))})
            for b in d["buffers"]
        }
        d["calls"] = [
            KernelCall(
                c["kernel"], c["op"], tuple(c["inputs"]), tuple(c["outputs"]), c.get("attrs", {})
            )
            for c in d["calls"]
        ]
        return Plan(**d)

    @staticmethod
    def from_json(text: str) -> Plan:
        return Plan.from_dict(json.loads(text))

    # -- views -----------------------------------------------------------------------------
    @property
    def kernels(self) -> dict[str, int]:
        """kernel name -> number of calls (sorted by name)."""
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.kernel] = out.get(c.kernel, 0) + 1
            if "decode_kernel" in c.attrs:
                out[c.attrs["decode_kernel"]] = out.get(c.attrs["decode_kernel"], 0) + 1
        return dict(sorted(out.items()))

    def weights(self) -> list[BufferSpec]:
        return [b for b in self.buffers.values() if b.kind == "weight"]

    def to_text(self) -> str:
        """Deterministic human-readable form (what `ninfer compile` prints)."""
        L: list[str] = []
        L.append(f"plan {self.name} ({self.architecture}) device={self.device} dtype={self.dtype}")
        L.append("options: " + " ".join(f"{k}={self.options[k]}" for k in sorted(self.options)))
        L.append("passes: " + " -> ".join(self.passes))
        L.append("fused: " + " ".join(f"{k}={v}" for k, v in self.fusions.items()))
        if self.model.get("declared"):
            L.append(
                "declared: "
                + " ".join(f"{k}({v})" for k, v in sorted(self.model["declared"].items()))
            )
        kv = self.kv
        L.append(
            f"kv: dtype={kv['dtype']} page_size={kv['page_size']} pages={kv.get('num_pages')} "
            f"capacity={kv.get('capacity_tokens')} tokens layers={kv['layers']} bytes/token={kv['bytes_per_token']}"
        )
        if "k_layout" in kv:
            L.append(f"  k: {kv['k_layout']}")
            L.append(f"  v: {kv['v_layout']}")
        st = self.state
        if st.get("layers"):
            L.append(
                f"state: slots={st['slots']} bytes/slot={st['bytes_per_slot']} layers={st['layers']}"
            )
            L.append(f"  {st['layout']}")
        else:
            L.append("state: none")
        L.append("ledger:")
        for e in self.ledger["entries"]:
            L.append(f"  {e['item']:<12} {e['bytes']:>16,} B  {e['detail']}")
        L.append(
            f"  {'total':<12} {self.ledger['total']:>16,} B  of budget {self.ledger['budget']:,} B"
        )
        buckets = " ".join(map(str, self.cuda_graph_buckets)) or "none"
        L.append(f"cuda graph buckets: {buckets}")
        L.append("kernels: " + " ".join(f"{k}x{v}" for k, v in self.kernels.items()))
        L.append("weights:")
        for b in self.weights():
            how = b.layout if b.layout == "plain" else f"{b.layout}({len(b.sources)})"
            # no executor reads GGML blocks yet: say that they are dequantised when loaded
            load = " (dequantised at load)" if (b.format or "").startswith("gguf:") else ""
            L.append(f"  @{b.name}: {b.type} {b.format}{load} {how}")
        L.append("calls:")
        for i, c in enumerate(self.calls):
            ins = ", ".join(
                ("@" if self.buffers[n].kind == "weight" else "%") + n for n in c.inputs
            )
            outs = ", ".join("%" + n for n in c.outputs)
            types = ", ".join(self.buffers[n].type for n in c.outputs)
            L.append(
                f"  {i:>3} {c.kernel:<32} {outs} = {c.op}({ins}){format_attrs(c.attrs)} : {types}"
            )
        L.append("outputs: " + ", ".join("%" + o for o in self.outputs))
        return "\n".join(L) + "\n"

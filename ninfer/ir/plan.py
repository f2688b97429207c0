"""The execution plan: an ordered, serialisable list of kernel calls over named buffers, plus
the KV layout, the memory ledger and the CUDA Graph buckets.

This is the lowest level of the IR (what `passes/lower.py` produces, what `ninfer compile`
prints and what the runtime executes); it is plain data with a JSON round trip, so a plan can
be compiled on one machine and inspected or run on another.

Buffers:
    input       step inputs bound per step (tokens, positions, logit_rows)
    weight      loaded once from the artifact (format, sources, layout say how)
    activation  values produced by calls within one step
Caches (`kv.L<i>`, `state.L<i>`) persist across steps; calls name them in `attrs["cache"]`.
The options, KV layout, state slots and ledger are typed sections (ninfer.ir.plan_sections).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ninfer.ir.graph import Shard
from ninfer.ir.plan_sections import (
    KVLayout,
    Ledger,
    LedgerEntry,
    ParallelLayout,
    PlanOptions,
    StateLayout,
    VisionLayout,
    kv_from_dict,
    ledger_from_dict,
    options_from_dict,
    parallel_from_dict,
    section_dict,
    state_from_dict,
    vision_from_dict,
)
from ninfer.ir.plan_text import summary_lines, verbose_lines

__all__ = [
    "BufferSpec",
    "KVLayout",
    "KernelCall",
    "Ledger",
    "LedgerEntry",
    "ParallelLayout",
    "Plan",
    "PlanOptions",
    "StateLayout",
    "VisionLayout",
    "launch_for",
]

PLAN_VERSION = 1


@dataclass(frozen=True)
class BufferSpec:
    name: str
    kind: str  # input | weight | activation
    type: str  # TensorType text, e.g. "f32[T,64]"
    format: str | None = None  # weights: storage format
    sources: tuple[str, ...] = ()  # weights: artifact tensors
    layout: str | None = None  # weights: plain | concat | stack | stack_concat
    shards: tuple[Shard | None, ...] = ()  # weights: the part of each source kept (graph.Shard)


def launch_for(launches: list[list[Any]], rows: int, default: str) -> tuple[str, list[int]]:
    """(kernel, config) a call's `launch` attr gives `rows` rows of x: the launch
    `[first_row, last_row, kernel, config]` they fall in, else (`default`, [])."""
    for lo, hi, kernel, cfg in launches:
        if lo <= rows <= hi:
            return kernel, cfg
    return default, []


def _buffer_dict(b: BufferSpec) -> dict[str, Any]:
    d = asdict(b)
    if not b.shards:  # a whole weight reads as before tensor parallelism
        del d["shards"]
    return d


@dataclass(frozen=True)
class KernelCall:
    kernel: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def kernel_for(self, rows: int, decode: bool = False) -> tuple[str, list[int]]:
        """(kernel, launch config) that runs this call over `rows` rows of its first input,
        in a decode step (`decode`: its decode_kernel where it names one) or any other."""
        name = self.attrs.get("decode_kernel", self.kernel) if decode else self.kernel
        return launch_for(self.attrs.get("launch", []), rows, name)


@dataclass
class Plan:
    name: str
    architecture: str
    device: str
    dtype: str
    options: PlanOptions
    passes: list[str]
    fusions: dict[str, int]
    model: dict[str, Any]  # vocab, hidden, layer_types, hybrid, declared components
    buffers: dict[str, BufferSpec]
    caches: dict[str, dict[str, Any]]
    calls: list[KernelCall]
    inputs: list[str]
    outputs: list[str]
    kv: KVLayout
    state: StateLayout
    ledger: Ledger
    cuda_graph_buckets: tuple[int, ...]  # decode batch sizes replayed from CUDA Graphs
    version: int = PLAN_VERSION
    vision: VisionLayout | None = None  # the vision tower's calls run apart from the step
    parallel: ParallelLayout | None = None  # tensor parallelism: this plan's rank; None: whole

    @property
    def vision_calls(self) -> tuple[int, ...]:
        """Indices of the calls of the vision stage (one run per image or video)."""
        return tuple(i for i, c in enumerate(self.calls) if c.attrs.get("stage") == "vision")

    @property
    def step_calls(self) -> tuple[int, ...]:
        """Indices of the calls one step runs (all but the vision stage's)."""
        return tuple(i for i, c in enumerate(self.calls) if c.attrs.get("stage") != "vision")

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["buffers"] = [_buffer_dict(b) for b in self.buffers.values()]
        for name in ("options", "kv", "state", "ledger"):
            d[name] = section_dict(getattr(self, name))
        d["vision"] = None if self.vision is None else section_dict(self.vision)
        if self.parallel is None:  # a whole-model plan reads as before tensor parallelism
            del d["parallel"]
        else:
            d["parallel"] = section_dict(self.parallel)
        d["cuda_graph_buckets"] = list(self.cuda_graph_buckets)
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        if d.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version {d.get('version')} is not {PLAN_VERSION}")
        d = dict(d)
        d["buffers"] = {
            b["name"]: BufferSpec(
                **{
                    **b,
                    "sources": tuple(b.get("sources", ())),
                    "shards": tuple(
                        None if s is None else Shard(**{**s, "segments": tuple(s["segments"])})
                        for s in b.get("shards", ())
                    ),
                }
            )
            for b in d["buffers"]
        }
        d["calls"] = [
            KernelCall(
                c["kernel"], c["op"], tuple(c["inputs"]), tuple(c["outputs"]), c.get("attrs", {})
            )
            for c in d["calls"]
        ]
        d["options"] = options_from_dict(d["options"])
        d["kv"] = kv_from_dict(d["kv"])
        d["state"] = state_from_dict(d["state"])
        d["ledger"] = ledger_from_dict(d["ledger"])
        d["vision"] = vision_from_dict(d.get("vision"))
        d["cuda_graph_buckets"] = tuple(d["cuda_graph_buckets"])
        d["parallel"] = parallel_from_dict(d.get("parallel"))
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

    def to_text(self, verbose: bool = False) -> str:
        """Deterministic human-readable form (what `ninfer compile` prints): the summary, and
        with `verbose` the weights and calls, identical layers folded (ninfer.ir.plan_text)."""
        lines = summary_lines(self) + (verbose_lines(self) if verbose else [])
        return "\n".join(lines) + "\n"

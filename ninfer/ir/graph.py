"""The graph: step inputs, weights, ops in execution order, outputs.

Values are in SSA form: every name is defined once (a graph input, a weight or one op output)
and used only after its definition. Op outputs keep their types in `Graph.values`.

Weights name the artifact tensors they are read from. A plain weight reads one tensor; passes
create derived weights:

    layout "plain"   sources (t,)            value = t
    layout "concat"  sources (a, b, c)       value = cat([a, b, c], dim=0)     (fused GEMMs)
    layout "stack"   sources (e0, e1, ...)   value = stack([e0, e1, ...])     (MoE experts)
    layout "stack_concat" sources (g0..gE-1, u0..uE-1)
                                             value = stack([cat([g_i, u_i]) for i])

A weight of a tensor-parallel rank's graph (passes/shard.py) also names the part of each source
it keeps (`shards`, one `Shard` or None per source, applied to each source before the layout
combines them); an empty `shards` keeps every source whole.

Step state that lives across steps (paged KV cache, recurrent state slots) is not a value: the
ops that use it name it with a `cache` attribute, and the graph lists it in `meta["caches"]`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ninfer.ir.types import TensorType


@dataclass(frozen=True)
class Shard:
    """The part of one source tensor a tensor-parallel rank keeps: along dimension `dim`, cut
    the source into `segments` (sizes adding up to that dimension; () = one segment), cut each
    segment into `parts` contiguous pieces of ceil(len / parts) rows (the last may be shorter)
    and keep piece `index` of each, concatenated in order.

        q_proj [heads*D, H], 2 ranks:        Shard(0, 1, 2)            rows of heads 2..3 (of 4)
        o_proj [H, heads*D], 2 ranks:        Shard(1, 1, 2)            columns of heads 2..3
        in_proj_qkv [2Kd+Vd, H], 2 ranks:    Shard(0, 1, 2, (Kd, Kd, Vd))  half of q, of k, of v
    """

    dim: int
    index: int
    parts: int
    segments: tuple[int, ...] = ()

    def size(self, length: int) -> int:
        """Length of the kept part of a dimension of `length`."""
        return sum(len(r) for r in self.ranges(length))

    def ranges(self, length: int) -> list[range]:
        """The kept index ranges along `dim`, in order, of a dimension of `length`."""
        segments = self.segments or (length,)
        if sum(segments) != length:
            raise ValueError(f"shard segments {segments} do not add up to {length}")
        out, start = [], 0
        for seg in segments:
            piece = -(-seg // self.parts)
            lo = start + min(self.index * piece, seg)
            out.append(range(lo, start + min((self.index + 1) * piece, seg)))
            start += seg
        return out


@dataclass(frozen=True)
class Weight:
    """A weight value: the type kernels read, the storage format and the artifact sources."""

    name: str
    type: TensorType
    format: str  # storage format of the sources: f32 | f16 | bf16 | fp8 | nvfp4 | gguf:<TYPE>
    sources: tuple[str, ...]
    layout: str = "plain"  # plain | concat | stack | stack_concat
    shards: tuple[Shard | None, ...] = ()  # per source (tensor parallelism); () = whole


@dataclass
class Op:
    """One operation. `kind` names its signature in ir.ops; `kernel` is set by assign_kernels."""

    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    kernel: str | None = None


@dataclass
class Graph:
    """A model forward over one step of tokens.

    `inputs` and `values` map names to types; `weights` map names to Weight; `ops` run in order;
    `outputs` name the values the step returns. `meta` carries the model facts and the decisions
    passes make (kv layout, ledger, buckets, applied passes) in plain JSON-able data.
    """

    name: str
    inputs: dict[str, TensorType]
    weights: dict[str, Weight]
    ops: list[Op]
    values: dict[str, TensorType]
    outputs: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> Graph:
        return Graph(
            self.name,
            dict(self.inputs),
            dict(self.weights),
            [Op(o.kind, o.inputs, o.outputs, copy.deepcopy(o.attrs), o.kernel) for o in self.ops],
            dict(self.values),
            list(self.outputs),
            copy.deepcopy(self.meta),
        )

    def type_of(self, name: str) -> TensorType:
        if name in self.values:
            return self.values[name]
        if name in self.inputs:
            return self.inputs[name]
        if name in self.weights:
            return self.weights[name].type
        raise KeyError(name)

    def users(self) -> dict[str, list[int]]:
        """value name -> indices of the ops that read it (in order)."""
        out: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            for name in op.inputs:
                out.setdefault(name, []).append(i)
        return out

    def producer(self) -> dict[str, int]:
        """value name -> index of the op that defines it."""
        return {name: i for i, op in enumerate(self.ops) for name in op.outputs}

    def prune(self) -> Graph:
        """Drop ops whose outputs nobody reads, and weights no op reads (in place; returns self)."""
        keep_ops: list[Op] = []
        live = set(self.outputs)
        for op in reversed(self.ops):
            if any(o in live for o in op.outputs) or op.attrs.get("cache"):
                keep_ops.append(op)
                live.update(op.inputs)
        self.ops = keep_ops[::-1]
        defined = {o for op in self.ops for o in op.outputs}
        self.values = {k: v for k, v in self.values.items() if k in defined}
        self.weights = {k: w for k, w in self.weights.items() if k in live}
        return self

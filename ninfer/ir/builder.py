"""GraphBuilder: adds inputs, weights and ops while inferring every output type.

Architecture builders (ir/models/) call `op(kind, inputs, attrs, names)`; the builder asks the op
signature for the output types, so a builder cannot declare a wrong type.
"""

from __future__ import annotations

from typing import Any

from ninfer.ir.graph import Graph, Op, Weight
from ninfer.ir.ops import SignatureError, infer
from ninfer.ir.types import TensorType

# name -> (storage format, logical shape) of every artifact tensor
TensorTable = dict[str, tuple[str, tuple[int, ...]]]


class MissingTensor(KeyError):
    """The artifact lacks a tensor the architecture needs."""


class GraphBuilder:
    def __init__(self, name: str, tensors: TensorTable, dtype: str):
        self.tensors = tensors
        self.dtype = dtype
        self.graph = Graph(name, {}, {}, [], {}, [], {"dtype": dtype, "caches": {}})

    def input(self, name: str, t: TensorType) -> str:
        self.graph.inputs[name] = t
        return name

    def has(self, tensor: str) -> bool:
        return tensor in self.tensors

    def weight(self, tensor: str) -> str:
        """A plain weight read from artifact tensor `tensor`; its value name is the tensor name."""
        if tensor not in self.graph.weights:
            if tensor not in self.tensors:
                raise MissingTensor(tensor)
            fmt, shape = self.tensors[tensor]
            self.graph.weights[tensor] = Weight(
                tensor, TensorType(self.dtype, shape), fmt, (tensor,)
            )
        return tensor

    def sized(self, tensor: str, rows: int, what: str) -> str:
        """`weight(tensor)`, whose first dimension must be the config's `what` (`rows`)."""
        shape = self.graph.weights[self.weight(tensor)].type.shape
        if shape[0] != rows:
            raise SignatureError(f"{tensor} has {shape[0]} rows but the config's {what} is {rows}")
        return tensor

    def stacked(self, name: str, sources: list[str]) -> str:
        """A [E, N, K] weight stacked from per-expert 2-D tensors."""
        for s in sources:
            if s not in self.tensors:
                raise MissingTensor(s)
        fmts = {self.tensors[s][0] for s in sources}
        shapes = {self.tensors[s][1] for s in sources}
        if len(shapes) != 1:
            raise MissingTensor(f"{name}: experts have different shapes {sorted(shapes)}")
        shape = (len(sources), *next(iter(shapes)))
        fmt = fmts.pop() if len(fmts) == 1 else "mixed"
        self.graph.weights[name] = Weight(
            name, TensorType(self.dtype, shape), fmt, tuple(sources), "stack"
        )
        return name

    def op(
        self, kind: str, inputs: list[str], attrs: dict[str, Any] | None, names: list[str]
    ) -> list[str]:
        attrs = dict(attrs or {})
        types = infer(kind, [self.graph.type_of(n) for n in inputs], attrs)
        if len(types) != len(names):
            raise ValueError(f"{kind} yields {len(types)} values, {len(names)} names given")
        for n, t in zip(names, types):
            if n in self.graph.values or n in self.graph.inputs or n in self.graph.weights:
                raise ValueError(f"value {n!r} defined twice")
            self.graph.values[n] = t
        self.graph.ops.append(Op(kind, tuple(inputs), tuple(names), attrs))
        return names

    def op1(self, kind: str, inputs: list[str], attrs: dict[str, Any] | None, name: str) -> str:
        return self.op(kind, inputs, attrs, [name])[0]

    def cache(self, name: str, desc: dict[str, Any]) -> str:
        self.graph.meta["caches"][name] = desc
        return name

    def finish(self, outputs: list[str], **meta: Any) -> Graph:
        self.graph.outputs = list(outputs)
        self.graph.meta.update(meta)
        return self.graph

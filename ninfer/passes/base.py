"""What a pass is: a named function `Graph -> Graph` that reads the compile options.

A pass never mutates its input graph: it copies, rewrites the copy and returns it. It records
what it did in `graph.meta` (e.g. `meta["fusions"]["fuse_qkv"] = 2`) so `ninfer compile` can
print it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ninfer.ir.graph import Graph
from ninfer.passes.options import CompileOptions


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph, CompileOptions], Graph]
    doc: str = ""

    def __call__(self, graph: Graph, options: CompileOptions) -> Graph:
        out = self.run(graph, options)
        out.meta.setdefault("passes", []).append(self.name)
        return out

"""Phase 0: check the IR invariants of ir.verify before any rewrite."""

from __future__ import annotations

from ninfer.ir.graph import Graph
from ninfer.ir.verify import verify
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _run(graph: Graph, options: CompileOptions) -> Graph:
    return verify(graph.copy())


VERIFY = Pass("verify", _run, "check SSA, signatures and declared types")

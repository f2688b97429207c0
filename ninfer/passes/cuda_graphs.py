"""Choose CUDA Graph batch buckets: one graph per exact decode batch size 1..max_concurrency,
so a decode step of n rows replays graph n with no padding. cpu plans have none."""

from __future__ import annotations

from ninfer.ir.graph import Graph
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    use = options.device == "cuda" and options.cuda_graphs
    g.meta["cuda_graph_buckets"] = list(range(1, options.max_concurrency + 1)) if use else []
    return g


CUDA_GRAPHS = Pass("cuda_graphs", _run, "decode batch buckets 1..max_concurrency (cuda)")

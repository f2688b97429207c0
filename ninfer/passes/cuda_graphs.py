"""Choose CUDA Graph batch buckets: one graph per exact decode batch size 1..max_concurrency,
so a decode step of n rows replays graph n with no padding; a speculating engine's verify steps
are decode steps of up to `verify_rows` rows (a row per verified position), so its buckets go
up to that, except on a hybrid (Gated DeltaNet) model, whose verify steps run eagerly as chunks
(they write each position's recurrent state into a round slot). cpu plans have none."""

from __future__ import annotations

from ninfer.ir.graph import Graph
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    use = options.device == "cuda" and options.cuda_graphs
    hybrid = bool(g.meta.get("state", {}).get("layers"))  # (choose_kv ran before)
    top = max(options.max_concurrency, 0 if hybrid else options.verify_rows)
    g.meta["cuda_graph_buckets"] = list(range(1, top + 1)) if use else []
    return g


CUDA_GRAPHS = Pass(
    "cuda_graphs", _run, "decode batch buckets 1..max(max_concurrency, verify_rows) (cuda)"
)

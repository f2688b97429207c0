"""What the CUDA executor's graphs are captured with: scratch step layouts (one-token rows on
the scratch KV page and state slot, which replays overwrite with real steps), buffers for a
plan's extra step inputs, and the capture itself (warm-up on a side stream, then the graph in
the executor's memory pool). Used by the decode graphs (executor.py) and the chain graphs
(chain.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ninfer.runtime.executors.cuda.step_layout import StepLayout


def scratch_layouts(ex: Any, rows: int, steps: int = 1) -> tuple[StepLayout, torch.Tensor]:
    """`steps` layouts of `rows` one-token rows on the scratch KV page and state slot, in
    one pinned buffer: what a graph is captured against (replays fill in real steps)."""
    lay = StepLayout(rows, rows, rows, ex.max_pages, ex._axes)
    host = torch.zeros(steps * lay.size, dtype=torch.int32, pin_memory=True)
    page = ex.kv.scratch_page if ex.kv is not None else 0
    for h in host.numpy().reshape(steps, lay.size):
        lay.view(h, "slots")[:] = page * ex.page_size
        lay.view(h, "seq_lens")[:] = 1
        lay.view(h, "cu")[:] = np.arange(rows + 1)
        lay.view(h, "state")[:] = ex.state.scratch_slot if ex.state is not None else 0
        lay.view(h, "rows")[:] = np.arange(rows)
        lay.view(h, "tables")[:] = page
    return lay, host


def extra_buffers(ex: Any, rows: int) -> dict[str, torch.Tensor]:
    """A graph's buffers for the plan's extra step inputs ([rows, width] each)."""
    return {n: torch.zeros(rows, w, dtype=ex.dtype, device=ex.device) for n, w in ex._extra.items()}


def captured(ex: Any, body: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
    """`body` captured into a CUDA Graph in `ex`'s pool, after two warm-up runs on
    a side stream (they compile every kernel variant); (graph, body's output)."""
    side = torch.cuda.Stream(ex.device)
    side.wait_stream(torch.cuda.current_stream(ex.device))
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream(ex.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=ex._pool):
        out = body()
    return graph, out

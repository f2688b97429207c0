"""A chain of decode steps replayed as ONE CUDA Graph: a drafter's whole round.

A drafter that feeds each step's pick back as the next step's input (the MTP head's greedy
round: step i+1 decodes the token step i chose, from the hidden row step i computed) needs no
host round trip between its steps. `CudaExecutor.run_chain` runs such a chain of S steps of
R one-token rows as one graph, captured once per (R, S) on first use:

    host    S step layouts (StepLayout of R rows each) packed in one pinned int32 buffer,
            filled from step 0's rows at once (step j: each row's position + j;
            step_layout.fill_chain), copied to the device once; step 0's extra inputs
            (`hidden` [R, hidden]) copied into the graph's buffer; step 0's tokens from
            `fed` (a device tensor) when given, else from the batch
    graph   for i in 0 .. S-1:
                out_i = the plan's forward over layout i (tokens of i > 0: pick_{i-1})
                pick_i, extra_{i+1} = link(out_i, hidden["final"]_i)
    result  picks [S, R] (the graph's output buffer: valid until the next chain of that shape)

`link(out, final)` is the drafter's choice (argmax of the logits, or of a reduced LM head over
`final`) and must be capturable (device ops only, no host sync); one link per executor.
Each step writes its KV through its layout's slot mapping before its attention reads, as a
plain decode step does, so the chain computes exactly what S `run` calls would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.runtime.executors.cuda.graphs import captured, extra_buffers, scratch_layouts
from ninfer.runtime.executors.cuda.step_layout import StepLayout, fill_chain
from ninfer.runtime.step import StepBatch

Link = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class ChainGraph:
    rows: int
    steps: int
    link: Link
    graph: Any  # torch.cuda.CUDAGraph
    host: torch.Tensor  # pinned int32 [steps * layout size]
    device: torch.Tensor  # the graph's input buffer
    copied: Any  # torch.cuda.Event: the last host -> device copy finished
    extra: dict[str, torch.Tensor]  # step 0's extra inputs, [rows, width]
    picks: torch.Tensor  # [steps, rows] output buffer


def chain_fits(ex: Any, first: StepBatch) -> bool:
    """Whether a chain from `first` can run as a chain graph on `ex`: one-token rows wanting
    logits, their number a graph bucket, tables within the plan's."""
    if not ex.graph_buckets or ex.is_hybrid or ex.media is not None or ex._axes != 1:
        return False
    return len(first.chunks) in ex.graph_buckets and all(
        len(c.token_ids) == 1 and c.want_logits and len(c.block_table) <= ex.max_pages
        for c in first.chunks
    )


def capture_chain(ex: Any, rows: int, steps: int, link: Link) -> ChainGraph:
    """Capture the chain of `steps` decode steps of `rows` rows (warm-up first, every step on
    the scratch KV page)."""
    lay, host = scratch_layouts(ex, rows, steps)
    dev = host.to(ex.device)
    extra = extra_buffers(ex, rows)

    def body() -> torch.Tensor:
        inputs, picks = dict(extra), []
        for i in range(steps):
            part = dev[i * lay.size : (i + 1) * lay.size]
            if i:
                lay.view(part, "tokens").copy_(picks[-1])
            step, base = ex._device_step(part, lay, True, 1)
            out = ex._forward(step, {**base, **inputs})
            pick, nxt = link(out, ex.hidden["final"])
            inputs = {**extra, **{k: v.to(ex.dtype) for k, v in nxt.items()}}
            picks.append(pick)
        return torch.stack(picks)

    graph, picks = captured(ex, body)
    ex.hidden = {}
    g = ChainGraph(rows, steps, link, graph, host, dev, torch.cuda.Event(), extra, picks)
    g.copied.record()
    return g


def replay_chain(
    ex: Any,
    g: ChainGraph,
    first: StepBatch,
    inputs: dict[str, torch.Tensor],
    fed: torch.Tensor | None,
) -> torch.Tensor:
    """Fill the chain's layouts from `first`, copy step 0's inputs in and replay; the picks
    [steps, rows] (the graph's buffer)."""
    lay = StepLayout(g.rows, g.rows, g.rows, ex.max_pages, ex._axes)
    g.copied.synchronize()  # the previous copy has read the pinned buffer
    scratch = ex.kv.scratch_page if ex.kv is not None else 0
    fill_chain(g.host.numpy(), lay, g.steps, first.chunks, ex.page_size, scratch)
    for name, value in ex._extra_inputs(inputs, g.rows).items():
        g.extra[name].copy_(value, non_blocking=True)
    g.device.copy_(g.host, non_blocking=True)
    g.copied.record()
    if fed is not None:
        lay.view(g.device, "tokens").copy_(fed[: g.rows])
    g.graph.replay()
    ex.hidden = {}
    return g.picks


def run_chain(
    ex: Any,
    first: StepBatch,
    steps: int,
    inputs: dict[str, torch.Tensor],
    link: Link,
    fed: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Run `steps` decode steps of `first`'s rows on `ex` as one chain graph, step j at each
    row's position + j: step 0 on `first` with `inputs` (its tokens from `fed` when given),
    each later step on the pick and inputs `link` made of the step before; the picks [steps,
    rows], valid until the next chain of that shape. None when the chain cannot run as a
    graph (chain_fits): the caller then runs the steps one `run` at a time. Leaves `ex.hidden`
    empty; ValueError when a row's block table does not cover its last step."""
    if steps < 1 or not chain_fits(ex, first):
        return None
    key = (len(first.chunks), steps)
    g = ex._chains.get(key)
    if g is None or g.link != link:
        g = ex._chains[key] = capture_chain(ex, key[0], key[1], link)
    picks = replay_chain(ex, g, first, inputs, fed)
    ex.tokens_computed += key[0] * key[1]
    return picks

"""A chain of decode steps replayed as ONE CUDA Graph: a drafter's whole round.

A drafter that feeds each step's pick back as the next step's input (the MTP head's greedy
round: step i+1 decodes the token step i chose, from the hidden row step i computed) needs no
host round trip between its steps. `CudaExecutor.run_chain` runs such a chain of S steps of
R rows (one per sequence) as one graph, captured once per (F, R, S) on first use, where F is
the first step's rows: R when each sequence feeds one position, more for a wide first step
(the round after accepted drafts feeds the head every position the target verified): its
positions run as one-token rows with logits (verify_rows' rows), padded to F, a power of two
(rows on the scratch page), and only each sequence's last (its tip) goes on:

    host    the S step layouts (the first of F rows, the others of R) and, when wide, the R
            tip rows, packed in one pinned int32 buffer, filled at once (chain_layout.py:
            step j >= 1 at each tip's position + j), copied to the device once; the first
            step's extra inputs (`hidden`, a row per position) copied into the graph's buffer
            [F, hidden]; its tokens from `fed` (a device tensor) when given, else from the
            batch
    graph   for i in 0 .. S-1:
                out_i = the plan's forward over layout i (tokens of i > 0: pick_{i-1})
                (i = 0, wide: out_0 and the hidden rows cut to the tip rows)
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

from ninfer.runtime.executors.cuda.chain_layout import ChainLayout
from ninfer.runtime.executors.cuda.graphs import captured, extra_buffers
from ninfer.runtime.step import StepBatch

Link = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class ChainGraph:
    layout: ChainLayout  # its host buffer: the step layouts and tips (chain_layout.py)
    link: Link
    graph: Any  # torch.cuda.CUDAGraph
    device: torch.Tensor  # the graph's input buffer (the host buffer's device copy)
    copied: Any  # torch.cuda.Event: the last host -> device copy finished
    extra: dict[str, torch.Tensor]  # the first step's extra inputs, [first, width]
    picks: torch.Tensor  # [steps, rows] output buffer


def chain_fits(ex: Any, first: StepBatch) -> bool:
    """Whether a chain from `first` can run as a chain graph on `ex`: chunks wanting logits,
    as many positions in all as a graph bucket holds rows, tables within the plan's."""
    if not ex.graph_buckets or ex.is_hybrid or ex.media is not None or ex._axes != 1:
        return False
    return first.num_tokens in ex.graph_buckets and all(
        c.want_logits and not c.media and len(c.block_table) <= ex.max_pages for c in first.chunks
    )


def capture_chain(ex: Any, first: int, rows: int, steps: int, link: Link) -> ChainGraph:
    """Capture the chain of `steps` decode steps of `rows` rows, the first of `first` rows
    (warm-up first, every step on the scratch KV page)."""
    scratch = ex.kv.scratch_page if ex.kv is not None else 0
    layout = ChainLayout(first, rows, steps, ex.max_pages, ex.page_size, scratch)
    dev = layout.host.to(ex.device)
    tip_rows = layout.tips(dev)
    extra = extra_buffers(ex, first)

    def body() -> torch.Tensor:
        inputs, picks = dict(extra), []
        for i in range(steps):
            lay, part = layout.step(i, dev)
            if i:
                lay.view(part, "tokens").copy_(picks[-1])
            step, base = ex._device_step(part, lay, True, 1)
            out, final = ex._forward(step, {**base, **inputs}), ex.hidden["final"]
            if i == 0 and layout.wide:
                out, final = out.index_select(0, tip_rows), final.index_select(0, tip_rows)
            pick, nxt = link(out, final)
            inputs = {**extra, **{k: v.to(ex.dtype) for k, v in nxt.items()}}
            picks.append(pick)
        return torch.stack(picks)

    graph, picks = captured(ex, body)
    ex.hidden = {}
    g = ChainGraph(layout, link, graph, dev, torch.cuda.Event(), extra, picks)
    g.copied.record()
    return g


def replay_chain(
    ex: Any,
    g: ChainGraph,
    first: StepBatch,
    inputs: dict[str, torch.Tensor],
    fed: torch.Tensor | None,
) -> torch.Tensor:
    """Fill the chain's layouts from `first`, copy the first step's inputs in and replay; the
    picks [steps, rows] (the graph's buffer)."""
    g.copied.synchronize()  # the previous copy has read the pinned buffer
    g.layout.fill(first.chunks)
    n = first.num_tokens  # the graph's rows past n (padding) compute on the scratch page
    for name, value in ex._extra_inputs(inputs, n).items():
        g.extra[name][:n].copy_(value, non_blocking=True)
    g.device.copy_(g.layout.host, non_blocking=True)
    g.copied.record(ex._stream)
    if fed is not None:
        lay, part = g.layout.step(0, g.device)
        lay.view(part, "tokens").copy_(fed[: g.layout.first])
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
    """Run `steps` decode steps of `first`'s sequences on `ex` as one chain graph: step 0 on
    `first` with `inputs` (every position of a chunk as a row; its tokens from `fed` when
    given), step j >= 1 on one row per chunk at its last position + j, on the pick and inputs
    `link` made of the step before (of the tip row, after a wide step 0); the picks [steps,
    rows], valid until the next chain of that shape. None when the chain cannot run as a
    graph (chain_fits): the caller then runs the steps one `run` at a time. Leaves `ex.hidden`
    empty; ValueError when a row's block table does not cover its last step."""
    if steps < 1 or not chain_fits(ex, first):
        return None
    if fed is not None and first.num_tokens != len(first.chunks):
        raise ValueError("a chain fed on the device takes one-token rows")
    key = (_first_rows(ex, first), len(first.chunks), steps)
    g = ex._chains.get(key)
    if g is None or g.link != link:
        g = ex._chains[key] = capture_chain(ex, *key, link)
    picks = replay_chain(ex, g, first, inputs, fed)
    ex.tokens_computed += first.num_tokens + key[1] * (steps - 1)
    return picks


def _first_rows(ex: Any, first: StepBatch) -> int:
    """The first step's graph rows: its positions, a wide step's padded to a power of two
    within the buckets (one graph per power, not per count: with 8 rows of k = 3 a count
    would make up to 25 graphs per k)."""
    n = first.num_tokens
    if n == len(first.chunks):
        return n
    padded = 1 << (n - 1).bit_length()
    return padded if padded in ex.graph_buckets else n

"""How a CUDA step's host metadata is laid out, how a verify step becomes decode rows, and
what a step's timing record holds.

`StepLayout` gives the offsets of the one int32 array a step's metadata is packed into (copied
to the device once per step); `verify_rows` turns the verify chunks of a speculative step into
one-token rows, so it can run on the decode kernels and their CUDA Graph buckets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ninfer.runtime.step import SeqChunk


@dataclass
class StepRecord:
    """Timing of one step (kept when `collect_timings`): host seconds from `run` entry until
    the GPU work was queued, CUDA events around that work (read after a sync), and the
    perf_counter time of `run` entry (consecutive entries bound one whole engine step)."""

    decode: bool
    graph: bool
    rows: int
    tokens: int
    host_s: float
    start: Any  # torch.cuda.Event | None
    end: Any
    entered_s: float = 0.0

    def gpu_s(self) -> float | None:
        return None if self.start is None else self.start.elapsed_time(self.end) / 1e3


class StepLayout:
    """Offsets of the packed int32 metadata of a step of T tokens, N chunks, R logit rows and
    block tables W pages wide; `axes` rows of positions (3 for a vision plan's MRoPE); with
    `spill` (a hybrid model's verify step) T round slots, one per token."""

    def __init__(self, T: int, N: int, R: int, W: int, axes: int = 1, spill: bool = False):
        self.T, self.N, self.R, self.W, self.axes, self.spill = T, N, R, W, axes, spill
        sizes = [("tokens", T), ("positions", axes * T), ("slots", T), ("seq_lens", N), ("cu", N + 1),
                 ("state", N), ("rows", R), ("tables", N * W), ("spill", T if spill else 0)]  # fmt: skip
        self.at: dict[str, tuple[int, int]] = {}
        off = 0
        for name, n in sizes:
            self.at[name] = (off, off + n)
            off += n
        self.size = off

    def view(self, buf: np.ndarray | torch.Tensor, name: str):
        a, b = self.at[name]
        return buf[a:b]


def verify_rows(chunks: tuple[SeqChunk, ...], limit: int) -> tuple[SeqChunk, ...] | None:
    """`chunks` as one-token decode rows: each verify chunk (every position's logits wanted)
    becomes a row per position, in order, the other chunks must already be decode rows; None
    when a chunk is neither (a prefill) or the rows would be more than `limit`."""
    rows: list[SeqChunk] = []
    for c in chunks:
        n = len(c.token_ids)
        if not c.want_logits or c.media or c.spill_slots or c.num_logits != n:
            return None
        if n == 1:
            rows.append(c)
            continue
        for i, tok in enumerate(c.token_ids):
            rows.append(
                dataclasses.replace(c, token_ids=(tok,), start_pos=c.start_pos + i, num_logits=1)
            )
    return tuple(rows) if len(rows) <= limit else None

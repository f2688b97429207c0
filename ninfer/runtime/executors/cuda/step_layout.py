"""How a CUDA step's host metadata is laid out and filled, how a verify step becomes decode
rows, and what a step's timing record holds.

`StepLayout` gives the offsets of the one int32 array a step's metadata is packed into (copied
to the device once per step); `fill_step` writes a step into it (decode rows, the common case
and a graph replay's whole host work, by a short path; a chain of steps: chain_layout.py);
`verify_rows` turns the verify chunks of a speculative step into one-token rows, so it can run
on the decode kernels and their CUDA Graph buckets.
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


def fill_step(
    buf: np.ndarray,
    lay: StepLayout,
    chunks: tuple[SeqChunk, ...],
    rows: list[int],
    page_size: int,
    scratch: int,
    written: list[tuple[int, ...]] | None = None,
) -> None:
    """Write a step's metadata into `buf` (int32, laid out by `lay`): each chunk's tokens,
    positions, KV slots, sequence length, state slot and block table (the pages up to its last
    position; `scratch` after them), chunk boundaries, and the logit `rows`.

    `written`: for a buffer that keeps its contents between steps (a decode graph's), the
    tables its rows hold, kept here: a row's table is written again only where it changed (a
    new page every page_size positions). Converting a table of Python ints is most of a
    decode step's host work at long contexts (8 rows of 32k positions: about 1.2 ms a step on
    the CI machine, against 0.07 ms at 512)."""
    if lay.T == lay.N == len(chunks) and lay.axes == 1 and not lay.spill:
        _fill_rows(buf, lay, chunks, rows, page_size, scratch, written)
    else:
        _fill_chunks(buf, lay, chunks, rows, page_size, scratch)
        if written is not None:
            written.clear()  # every table was written whole: nothing to compare against


def _fill_chunks(
    buf: np.ndarray,
    lay: StepLayout,
    chunks: tuple[SeqChunk, ...],
    rows: list[int],
    ps: int,
    scratch: int,
) -> None:
    """fill_step for any chunks: prefill, verify and mixed steps, MRoPE, round slots."""
    tokens, positions, slots = (
        lay.view(buf, "tokens"),
        lay.view(buf, "positions"),
        lay.view(buf, "slots"),
    )
    seq_lens, cu, state = lay.view(buf, "seq_lens"), lay.view(buf, "cu"), lay.view(buf, "state")
    tables = lay.view(buf, "tables").reshape(lay.N, lay.W)
    tables.fill(scratch)
    t = 0
    cu[0] = 0
    for i, c in enumerate(chunks):
        n, end = len(c.token_ids), c.start_pos + len(c.token_ids)
        bt = np.asarray(_cover(c, end - 1, ps), dtype=np.int64)
        tables[i, : len(bt)] = bt
        pos = np.arange(c.start_pos, end)
        tokens[t : t + n] = c.token_ids
        if lay.axes == 1:
            positions[t : t + n] = pos
        else:  # MRoPE: [3, T] (temporal, height, width); text and decode rows (p, p, p) + delta
            pos3 = positions.reshape(3, lay.T)
            if c.mrope is not None:
                pos3[:, t : t + n] = c.mrope.positions(c.start_pos, n)
            else:
                pos3[:, t : t + n] = pos
        slots[t : t + n] = bt[pos // ps] * ps + pos % ps
        seq_lens[i] = end
        state[i] = c.state_slot if c.state_slot is not None else 0
        if lay.spill:  # per token: its verify chunk's round slot, -1 in other chunks
            lay.view(buf, "spill")[t : t + n] = c.spill_slots or -1
        t += n
        cu[i + 1] = t
    lay.view(buf, "rows")[:] = rows


def _fill_rows(
    buf: np.ndarray,
    lay: StepLayout,
    chunks: tuple[SeqChunk, ...],
    rows: list[int],
    ps: int,
    scratch: int,
    written: list[tuple[int, ...]] | None = None,
) -> None:
    """fill_step for one-token rows (a decode step): the same values from a few list
    assignments instead of a dozen array operations per chunk (the host work of every graph
    replay); with `written`, each table only where it differs from what the row holds."""
    tables = lay.view(buf, "tables").reshape(lay.N, lay.W)
    if written is None:
        tables.fill(scratch)
    elif len(written) != lay.N:  # nothing known of what the rows hold: write them whole
        written[:] = [()] * lay.N
        tables.fill(scratch)
    pos = [c.start_pos for c in chunks]
    slots = []
    for i, c in enumerate(chunks):
        bt = _cover(c, pos[i], ps)
        if written is None:
            tables[i, : len(bt)] = bt
        elif bt != (old := written[i]):
            _write_table(tables[i], bt, old, scratch)
            written[i] = bt
        slots.append(bt[-1] * ps + pos[i] % ps)
    lay.view(buf, "tokens")[:] = [c.token_ids[0] for c in chunks]
    lay.view(buf, "positions")[:] = pos
    lay.view(buf, "slots")[:] = slots
    lay.view(buf, "seq_lens")[:] = [p + 1 for p in pos]
    lay.view(buf, "cu")[:] = range(len(chunks) + 1)
    lay.view(buf, "state")[:] = [0 if c.state_slot is None else c.state_slot for c in chunks]
    lay.view(buf, "rows")[:] = rows


def _write_table(row: np.ndarray, bt: tuple[int, ...], old: tuple[int, ...], scratch: int) -> None:
    """Turn a table row holding `old` (scratch after it) into one holding `bt`: only the pages
    past `old` when `bt` extends it (a sequence that grew), else the whole table."""
    n = len(old) if len(old) <= len(bt) and bt[: len(old)] == old else 0
    row[n : len(bt)] = bt[n:]
    if len(old) > len(bt):
        row[len(bt) : len(old)] = scratch


def _cover(c: SeqChunk, last: int, ps: int) -> tuple[int, ...]:
    """The pages of `c`'s block table up to the one holding position `last`; ValueError when
    the table is shorter."""
    need = last // ps + 1
    if len(c.block_table) < need:
        raise ValueError(
            f"block table of {len(c.block_table)} pages does not cover position {last}"
        )
    return c.block_table[:need]


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

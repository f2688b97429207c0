"""The host metadata of a chain graph (chain.py) and how a round fills it.

A chain of S decode steps keeps its S step layouts (step_layout.StepLayout: the first of F
one-token rows, the others of R) and, after a wide first step (F > R), the R tip rows, in one
pinned int32 buffer, copied to the device once per round:

    step 0      every position of each chunk as a row: tokens, positions, KV slots, lengths;
                rows past them (a wide first step padded to its graph's rows) on the scratch
                page
    step j > 0  one row per chunk at its last position + j (tokens: fed by the graph)
    tips        the row of each chunk's last position in step 0 (wide only)

A round's host work is on the path of every draft, and on a slow host each numpy call costs
microseconds, so the fill is one indexed write of the values that change (a Python list built
in one pass over the chunks, scattered through an index made once per chain shape). Chunk
boundaries, logit rows and state slots are the same in every round (a chain never runs on a
hybrid plan) and stay as constructed; the block tables are written again only when a row's
pages change (a new page every page_size positions). Every row's table holds its sequence's
pages up to the chain's last position: a step's attention reads only its length's pages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ninfer.runtime.executors.cuda.step_layout import StepLayout
from ninfer.runtime.step import SeqChunk


class ChainLayout:
    """The pinned buffer (`host`) of a chain of `steps` steps of `rows` rows, the first of
    `first` rows, on KV pages of `page_size` positions, tables `width` pages wide. Before any
    `fill` every row is on `scratch_page` (what a graph is captured against)."""

    def __init__(
        self, first: int, rows: int, steps: int, width: int, page_size: int, scratch_page: int
    ) -> None:
        self.first, self.rows, self.steps = first, rows, steps
        self.page_size, self.scratch = page_size, scratch_page
        self.lay0 = StepLayout(first, first, first, width)
        self.lay = StepLayout(rows, rows, rows, width)
        self.at = [0] + [self.lay0.size + i * self.lay.size for i in range(steps)]
        self.wide = first != rows
        self.host = torch.zeros(self.at[-1] + (rows if self.wide else 0), dtype=torch.int32)
        self.host = self.host.pin_memory() if torch.cuda.is_available() else self.host
        h = self.host.numpy()
        for i in range(steps):
            lay, part = self.step(i, h)
            n = lay.N
            lay.view(part, "slots")[:] = scratch_page * page_size
            lay.view(part, "seq_lens")[:] = 1
            lay.view(part, "cu")[:] = np.arange(n + 1)
            lay.view(part, "rows")[:] = np.arange(n)
            lay.view(part, "tables")[:] = scratch_page
        if self.wide:
            h[self.at[-1] :] = np.arange(rows)
        self._index = np.array(self._dynamic(), dtype=np.int64)
        self._pages: tuple | None = None  # what the tables last written hold

    def step(self, i: int, buf: np.ndarray | torch.Tensor):
        """(layout, its part of `buf`) of step i (buf: `host` or its device copy)."""
        lay = self.lay if i else self.lay0
        return lay, buf[self.at[i] : self.at[i] + lay.size]

    def tips(self, buf: torch.Tensor) -> torch.Tensor:
        """The tip rows' part of `buf` (wide chains)."""
        return buf[self.at[-1] :]

    def _dynamic(self) -> list[int]:
        """Offsets of the values `fill` writes, in its order."""
        out: list[int] = []
        for i in range(self.steps):
            lay = self.lay if i else self.lay0
            for name in ("tokens", "positions", "slots", "seq_lens") if i == 0 else (
                "positions", "slots", "seq_lens"
            ):  # fmt: skip
                a, b = lay.at[name]
                out.extend(range(self.at[i] + a, self.at[i] + b))
        if self.wide:
            out.extend(range(self.at[-1], self.at[-1] + self.rows))
        return out

    def fill(self, chunks: Sequence[SeqChunk]) -> None:
        """Write a round of `chunks` (`rows` chunks of at most `first` positions in all: the
        rest of step 0's rows on the scratch page); ValueError when a chunk's block table does
        not cover the chain's last position."""
        ps, steps = self.page_size, self.steps
        tokens: list[int] = []
        pos: list[int] = []
        tips: list[int] = []
        ends: list[int] = []
        pages: list[tuple[int, ...]] = []
        for c in chunks:
            s, n, bt = c.start_pos, len(c.token_ids), c.block_table
            last = s + n + steps - 2  # the chain's last position of this chunk
            need = last // ps + 1
            if len(bt) < need:
                raise ValueError(f"block table of {len(bt)} pages does not cover position {last}")
            pages.append(bt[:need])
            tokens.extend(c.token_ids)
            pos.extend(range(s, s + n))
            tips.append(len(pos) - 1)
            ends.append(s + n - 1)
        slot = [
            pages[i][p // ps] * ps + p % ps
            for i, c in enumerate(chunks)
            for p in range(c.start_pos, c.start_pos + len(c.token_ids))
        ]
        pad = self.first - len(pos)
        if pad < 0 or len(ends) != self.rows:
            raise ValueError(
                f"{len(ends)} chunks of {len(pos)} positions for a chain of {self.rows} rows"
                f" and {self.first} first-step rows"
            )
        scratch = [self.scratch * ps] * pad
        values = tokens + [0] * pad + pos + [0] * pad + slot + scratch
        values += [p + 1 for p in pos] + [1] * pad
        for j in range(1, steps):
            pj = [e + j for e in ends]
            values += pj
            values += [pages[i][p // ps] * ps + p % ps for i, p in enumerate(pj)]
            values += [p + 1 for p in pj]
        if self.wide:
            values += tips
        h = self.host.numpy()
        h[self._index] = values
        key = (tuple(len(c.token_ids) for c in chunks), pages)
        if key != self._pages:
            self._write_tables(h, chunks, pages)
            self._pages = key

    def _write_tables(
        self, h: np.ndarray, chunks: Sequence[SeqChunk], pages: list[tuple[int, ...]]
    ) -> None:
        """Every step's block tables: each row its chunk's `pages`, scratch after them."""
        width = self.lay.W
        per_chunk = np.full((len(chunks), width), self.scratch, dtype=np.int32)
        for i, p in enumerate(pages):
            per_chunk[i, : len(p)] = p
        first = np.full((self.first, width), self.scratch, dtype=np.int32)
        first[: sum(len(c.token_ids) for c in chunks)] = np.repeat(
            per_chunk, [len(c.token_ids) for c in chunks], axis=0
        )
        for i in range(self.steps):
            lay, part = self.step(i, h)
            lay.view(part, "tables")[:] = (first if i == 0 else per_chunk).reshape(-1)

"""The target's hidden rows an MTP head has not fed yet, kept by position on the device.

`observe` hands over one block of rows per chunk (positions s .. s+n-1); they stay as that
block (a segment), not row by row, so a round reads the rows it feeds as one slice of a block
(a view: no stack, no copy on the host side) and a superseded or fed range is a slice bound
moved, not a dict entry deleted per position. Segments are sorted by position and never
overlap; a gap between two (a reset after a prefix the target did not compute) is allowed.
"""

from __future__ import annotations

import torch


class HiddenRows:
    """Rows by position: `put` a block at a position (superseding every row at or after it),
    `take` a range, `drop_from` / `drop_below` a bound, `first` the lowest position held."""

    def __init__(self) -> None:
        self._segs: list[tuple[int, torch.Tensor]] = []  # (first position, rows [n, hidden])

    def put(self, start: int, rows: torch.Tensor) -> None:
        """Hold `rows` [n, hidden] at positions start .. start+n-1; rows held at or after
        `start` are dropped first (they were computed from tokens a later step recomputed)."""
        self.drop_from(start)
        if rows.shape[0]:
            self._segs.append((start, rows))

    def drop_from(self, pos: int) -> None:
        """Forget every row at a position >= `pos`."""
        while self._segs and self._segs[-1][0] >= pos:
            self._segs.pop()
        if self._segs:
            s, t = self._segs[-1]
            if s + t.shape[0] > pos:
                self._segs[-1] = (s, t[: pos - s])

    def drop_below(self, pos: int) -> None:
        """Forget every row at a position < `pos`."""
        while self._segs and self._segs[0][0] + self._segs[0][1].shape[0] <= pos:
            self._segs.pop(0)
        if self._segs:
            s, t = self._segs[0]
            if s < pos:
                self._segs[0] = (pos, t[pos - s :])

    def first(self) -> int | None:
        """The lowest position held (None: nothing)."""
        return self._segs[0][0] if self._segs else None

    def __contains__(self, pos: int) -> bool:
        return self.has(pos, pos + 1)

    def has(self, a: int, b: int) -> bool:
        """Whether every position in [a, b) is held."""
        for s, t in self._segs:
            e = s + t.shape[0]
            if a >= b:
                return True
            if s <= a < e:
                a = e
        return a >= b

    def take(self, a: int, b: int) -> torch.Tensor:
        """The rows of positions [a, b) ([b - a, hidden]; a view of one block when one holds
        them all). KeyError when one is not held."""
        parts = []
        for s, t in self._segs:
            e = s + t.shape[0]
            if s <= a < e:
                stop = min(b, e)
                parts.append(t[a - s : stop - s])
                a = stop
            if a >= b:
                break
        if a < b:
            raise KeyError(f"no hidden row at position {a}")
        return parts[0] if len(parts) == 1 else torch.cat(parts)

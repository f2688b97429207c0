"""3-axis rotary positions (MRoPE) of a prompt with images and videos, as transformers'
Qwen3.5 `get_rope_index` computes them.

Text token i at prompt index i gets position (p, p, p) with p = i + shift, where `shift` is
what the media runs before it added. A run of placeholders (an image, or one temporal patch of
a video) of lh x lw merged tokens (lh = h / merge, lw = w / merge), starting at index s, gets::

    base = s + shift
    token r of the run (row-major over lh x lw):  (base, base + r // lw, base + r % lw)
    after the run: shift += max(lh, lw) - lh * lw

so text after a run continues from the run's largest position + 1. Each temporal patch of a
video is its own run (its temporal position is the run's base, like an image's): Qwen3.5
separates frames by their timestamps; a video whose frames' placeholders are contiguous (no
`frame_offsets`) is read as its frames back to back. Decode tokens continue with i + `delta` (transformers'
rope_deltas), delta = the shift after the last run.

No torch import.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from ninfer.runtime.media_span import MediaSpan


@dataclass(frozen=True)
class MRope:
    """The runs of one prompt: `starts[k]` its first index, `shapes[k]` (lh, lw) merged, and
    `shifts[k]` the shift before run k; `delta` the shift after the last run."""

    starts: tuple[int, ...]
    shapes: tuple[tuple[int, int], ...]
    shifts: tuple[int, ...]
    delta: int

    @staticmethod
    def of(spans: Iterable[MediaSpan]) -> MRope | None:
        """The layout of a prompt's spans (in prompt order); None without media."""
        starts, shapes, shifts = [], [], []
        shift = 0
        for span in spans:
            _, h, w = span.grid_thw
            m = span.merge_size
            lh, lw = h // m, w // m
            for start, n in span.runs:  # a video's frames may also sit back to back
                for frame in range(start, start + n, lh * lw):
                    starts.append(frame)
                    shapes.append((lh, lw))
                    shifts.append(shift)
                    shift += max(lh, lw) - lh * lw
        if not starts:
            return None
        return MRope(tuple(starts), tuple(shapes), tuple(shifts), shift)

    def rebased(self, base: int) -> MRope:
        """The layout seen from prompt index `base` on: index i of it is prompt index base + i
        and gets that index's positions minus `base` on every axis (rotary attention is
        relative on each axis, so a stage whose KV starts at `base` attends as at the prompt's
        own positions: an MTP head after a reused prefix, ninfer/spec/mtp_media.py)."""
        return MRope(tuple(s - base for s in self.starts), self.shapes, self.shifts, self.delta)

    def positions(self, start: int, count: int) -> tuple[list[int], list[int], list[int]]:
        """(temporal, height, width) positions of prompt / output indices start..start+count-1."""
        t: list[int] = []
        h: list[int] = []
        w: list[int] = []
        k = bisect.bisect_right(self.starts, start) - 1  # the last run starting at or before
        for i in range(start, start + count):
            while k + 1 < len(self.starts) and self.starts[k + 1] <= i:
                k += 1
            if k < 0:
                t.append(i)
                h.append(i)
                w.append(i)
                continue
            lh, lw = self.shapes[k]
            r = i - self.starts[k]
            if r < lh * lw:
                base = self.starts[k] + self.shifts[k]
                t.append(base)
                h.append(base + r // lw)
                w.append(base + r % lw)
            else:
                p = i + self.shifts[k] + max(lh, lw) - lh * lw
                t.append(p)
                h.append(p)
                w.append(p)
        return t, h, w

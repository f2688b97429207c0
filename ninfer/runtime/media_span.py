"""Where a prompt's images and videos sit among its tokens (the engine's view of media).

The protocol layer renders each image or video as a run of `tokens` placeholder ids (the
model's image or video pad token) inside `Request.prompt_token_ids`, prepares the media
(`ninfer.media`, giving a `PreparedMedia`) and attaches one `MediaSpan` per item. The engine
hands the spans of each prefill chunk to the executor, which runs the vision tower on
`prepared` and writes its merged embeddings over the placeholder positions
`offset .. offset + tokens - 1`, and derives the 3-axis (MRoPE) positions from `grid_thw`.

A Qwen3.5 video is rendered frame by frame: each temporal patch's run of placeholders sits
between vision start / end tokens after its timestamp text (``<0.5 seconds><|vision_start|>
<|video_pad|>...<|vision_end|><1.5 seconds>...``). Its span then names where each run starts
(`frame_offsets`); without them the placeholders are one contiguous run (every image).
The 3-axis positions follow from the runs alone (ninfer/runtime/vision/mrope.py).

Prefix reuse keys a prompt by its token ids *and* the `digest` and `grid_thw` of every span
that a reused page overlaps: two prompts with the same placeholders but other images share no
page beyond the first placeholder.

Kept free of torch: `prepared` is opaque here (a `ninfer.media.PreparedMedia`, whose
`pixel_values` only the executor reads).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MediaSpan:
    """One image or video of a prompt.

    offset    index in prompt_token_ids of the first placeholder token
    tokens    merged vision tokens = number of placeholder ids (PreparedMedia.tokens)
    grid_thw  (t, h, w) in patches before merging (PreparedMedia.grid_thw)
    digest    SHA-256 of the source bytes (the media cache's key), for prefix reuse
    modality  "image" or "video"
    prepared  the PreparedMedia (opaque to the engine core)
    timestamps per temporal patch, seconds (video only)
    frame_offsets  video rendered per frame: the index of the first placeholder of each
              temporal patch's run (grid t entries, the first = offset, each run
              tokens / t long, increasing, not overlapping); () = one contiguous run
    """

    offset: int
    tokens: int
    grid_thw: tuple[int, int, int]
    digest: bytes
    modality: Literal["image", "video"]
    prepared: object
    timestamps: tuple[float, ...] = ()
    frame_offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.offset < 0 or self.tokens < 1:
            raise ValueError(f"a media span needs offset >= 0 and tokens >= 1, got {self}")
        object.__setattr__(self, "frame_offsets", tuple(int(o) for o in self.frame_offsets))
        t, h, w = self.grid_thw
        if min(t, h, w) < 1 or (t * h * w) % self.tokens:
            raise ValueError(f"media grid {self.grid_thw} does not fit {self.tokens} tokens")
        merge2 = t * h * w // self.tokens  # spatial merge squared
        side = round(merge2**0.5)
        if side * side != merge2 or h % side or w % side:
            raise ValueError(f"media grid {self.grid_thw} does not fit {self.tokens} tokens")
        offs = self.frame_offsets
        if offs:
            per = self.tokens // t
            if len(offs) != t or offs[0] != self.offset:
                raise ValueError(
                    f"frame_offsets need one entry per temporal patch ({t}), the first at the "
                    f"offset {self.offset}: got {offs}"
                )
            if any(b < a + per for a, b in itertools.pairwise(offs)):
                raise ValueError(f"frame runs of {per} placeholders overlap: {offs}")

    @property
    def merge_size(self) -> int:
        """The spatial merge of the vision tower (merge x merge patches per token)."""
        t, h, w = self.grid_thw
        return round((t * h * w // self.tokens) ** 0.5)

    @property
    def runs(self) -> tuple[tuple[int, int], ...]:
        """(prompt index of the first placeholder, placeholders) of each contiguous run:
        one per temporal patch with `frame_offsets`, else one for the whole item. Run k holds
        the item's merged embedding rows sum(lengths of runs before k) onwards."""
        if not self.frame_offsets:
            return ((self.offset, self.tokens),)
        per = self.tokens // self.grid_thw[0]
        return tuple((o, per) for o in self.frame_offsets)

    @property
    def end(self) -> int:
        """One past the last placeholder position."""
        start, n = self.runs[-1]
        return start + n

"""Where a prompt's images and videos sit among its tokens (the engine's view of media).

The protocol layer renders each image or video as a run of `tokens` placeholder ids (the
model's image or video pad token) inside `Request.prompt_token_ids`, prepares the media
(`ninfer.media`, giving a `PreparedMedia`) and attaches one `MediaSpan` per item. The engine
hands the spans of each prefill chunk to the executor, which runs the vision tower on
`prepared` and writes its merged embeddings over the placeholder positions
`offset .. offset + tokens - 1`, and derives the 3-axis (MRoPE) positions from `grid_thw`.

Prefix reuse keys a prompt by its token ids *and* the `digest` and `grid_thw` of every span
that a reused page overlaps: two prompts with the same placeholders but other images share no
page beyond the first placeholder.

Kept free of torch: `prepared` is opaque here (a `ninfer.media.PreparedMedia`, whose
`pixel_values` only the executor reads).
"""

from __future__ import annotations

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
    """

    offset: int
    tokens: int
    grid_thw: tuple[int, int, int]
    digest: bytes
    modality: Literal["image", "video"]
    prepared: object
    timestamps: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.offset < 0 or self.tokens < 1:
            raise ValueError(f"a media span needs offset >= 0 and tokens >= 1, got {self}")

    @property
    def end(self) -> int:
        """One past the last placeholder position."""
        return self.offset + self.tokens

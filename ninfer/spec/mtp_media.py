"""What the MTP head of a vision plan reads of the target's media (ninfer/ir/models/mtp.py).

Head position i of a sequence is the target's position base + i (`_HeadSeq.base`,
ninfer/spec/mtp.py) and feeds the token after it, target index base + i + 1. On a vision plan
the head reads, as the target's text stage does and as vLLM's Qwen3.5 MTP drafter does:

    positions    the target's 3-axis positions (MRoPE) of base + i, minus base on every axis
                 (`MRope.rebased`: rotary attention is relative per axis, so this is the
                 target's own geometry; with base 0 they are the target's positions exactly).
                 Draft positions after the prompt continue with the target's rope delta.
    embeddings   a row whose next token is an image or video placeholder takes that
                 placeholder's vision embedding, the one the target merged at base + i + 1
                 (the target executor's media encoder: encoded once, cached by digest), not
                 the pad id's row of the embedding table.

`HeadMedia` keeps each sequence's spans and 3-axis layout from the target's chunks
(`observe`), gives each head chunk its `mrope` and `media` (`fields`), and is the head
executor's media source (`executor.use_media`): `step_inputs` reads a head chunk's rows as the
target indices they embed and asks the target's encoder for those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.step import SeqChunk
from ninfer.runtime.vision.mrope import MRope


@dataclasses.dataclass
class _SeqMedia:
    spans: dict[int, MediaSpan] = dataclasses.field(default_factory=dict)  # by prompt offset
    mrope: MRope | None = None
    rebased: tuple[int, MRope | None] = (0, None)  # (base, mrope.rebased(base)), reused


class HeadMedia:
    """The target's media as the head sees it (module docstring). `encoder`: the target
    executor's media encoder; `base_of(seq_id)`: the target position of the sequence's head
    position 0 now."""

    def __init__(self, encoder: Any, base_of: Callable[[int], int]) -> None:
        self.encoder = encoder
        self._base_of = base_of
        self._seqs: dict[int, _SeqMedia] = {}

    def observe(self, chunk: SeqChunk) -> None:
        """Keep the spans and the 3-axis layout a target chunk carries (a prefill chunk holds
        the spans it overlaps; every chunk of a sequence with media holds its layout)."""
        if chunk.mrope is None and not chunk.media:
            return
        st = self._seqs.setdefault(chunk.seq_id, _SeqMedia())
        if chunk.mrope is not st.mrope:
            st.mrope, st.rebased = chunk.mrope, (0, chunk.mrope)
        for span in chunk.media:
            st.spans[span.offset] = span

    def forget(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def fields(self, seq_id: int, base: int, start: int, n: int) -> dict[str, Any]:
        """SeqChunk fields of a head chunk at head positions start .. start+n-1: its 3-axis
        layout (None: positions are indices) and the spans among the target indices it
        embeds, base+start+1 .. base+start+n."""
        st = self._seqs.get(seq_id)
        if st is None:
            return {}
        if st.mrope is not None and st.rebased[0] != base:
            st.rebased = (base, st.mrope.rebased(base))
        lo, hi = base + start + 1, base + start + n + 1
        spans = tuple(m for m in st.spans.values() if m.offset < hi and m.end > lo)
        return {"mrope": st.rebased[1], "media": spans}

    def step_inputs(
        self, chunks: Sequence[tuple[int, SeqChunk]], hidden: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(media_embeds [M, hidden], media_rows i32[M]) of a head step (the media encoder's
        contract): each chunk read at the target indices its tokens sit at."""
        at_target = [
            (begin, dataclasses.replace(c, start_pos=c.start_pos + self._base_of(c.seq_id) + 1))
            for begin, c in chunks
            if c.media
        ]
        return self.encoder.step_inputs(at_target, hidden)

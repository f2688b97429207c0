"""The plain dataclasses where the scheduler and the executor meet.

The scheduler (pure Python, no torch) decides *what* runs in a step and emits a `StepBatch`;
the executor (the only code that touches tensors) runs it and answers with the logits rows
the batch asked for.
Nothing else crosses that boundary, so every scheduling decision is testable with a fake
executor on CPU.

KV layout contract (shared by scheduler and executor)::

    page pool: pages 0..num_pages-1, each holding `page_size` consecutive token positions
    block_table[i] = page id holding positions [i*page_size, (i+1)*page_size) of that sequence

    seq A: positions 0..9, page_size 4   block_table = (7, 2, 5)
           page 7 ← pos 0..3 | page 2 ← pos 4..7 | page 5 ← pos 8..9 (+2 free slots)

A chunk computes `token_ids` at positions `start_pos .. start_pos+len-1`; its block table must
cover every position up to the end of the chunk. Pages before `start_pos` hold valid KV (from
earlier steps or a reused prefix). Hybrid models also carry a recurrent-state slot per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.vision.mrope import MRope


@dataclass(frozen=True)
class SeqChunk:
    """Work for one sequence in one step: a prefill chunk, one decode token, or a verify
    chunk (the decode token followed by draft tokens, logits at every one of them)."""

    seq_id: int  # engine-wide id of the sequence (stable for its lifetime)
    token_ids: tuple[int, ...]  # tokens to compute this step, len >= 1
    start_pos: int  # absolute position of token_ids[0]
    block_table: tuple[int, ...]  # KV pages covering positions [0, start_pos + len(token_ids))
    state_slot: int | None = None  # recurrent-state slot (hybrid models), else None
    want_logits: bool = True  # return logits of the last position of this chunk
    # with want_logits: logits of the last `num_logits` positions, in order (a speculative
    # verify chunk: the fed token and k drafts, k + 1 rows); 1 for every other chunk
    num_logits: int = 1
    # a hybrid verify chunk: `state_slot` is only read, and the recurrent state after the
    # chunk's position t is written to spill_slots[t] (len == len(token_ids)); empty otherwise
    spill_slots: tuple[int, ...] = ()
    # images / videos of the sequence with a placeholder among positions start_pos.. of this
    # chunk: the executor writes their vision embeddings over those rows (a chunk may start or
    # end inside a span)
    media: tuple[MediaSpan, ...] = ()
    # the sequence's 3-axis rotary positions (a prompt with media); None: position = index
    mrope: MRope | None = None


@dataclass(frozen=True)
class StateCopy:
    """Copy a recurrent-state slot (conv tail + DeltaNet state of every linear layer) before the
    step runs: used to restore a prefix checkpoint into a lane or to capture one."""

    src_slot: int
    dst_slot: int


@dataclass(frozen=True)
class PageCopy:
    """Copy one KV page (every attention layer, K and V, with scales) before the step runs:
    a sibling choice's own copy of the prompt's last, partial page (choices.py)."""

    src_page: int
    dst_page: int


FED = -1  # token id placeholder of a chunk whose token the previous step samples on the device


@dataclass(frozen=True)
class StepBatch:
    """Everything one model traversal computes. Chunks are ordered; prefill chunks and decode
    rows may be mixed. `state_copies` run first, in order.

    `fed_rows` (a step scheduled before the previous one was committed, see
    `Scheduler.schedule_ahead`): every chunk is one decode token whose id is not known on the
    host yet; chunk i takes the token sampled for logits row `fed_rows[i]` of the previous step,
    which the caller passes to `Executor.run` as a device tensor (`fed`). Their `token_ids`
    hold the placeholder `FED`."""

    chunks: tuple[SeqChunk, ...]
    state_copies: tuple[StateCopy, ...] = ()
    step_index: int = 0
    fed_rows: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

"""What the engine needs from an executor (the plan executor, or a fake in tests).

No torch import here: the logits are returned as the executor's tensor type and only the
sampler looks inside.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ninfer.runtime.step import StepBatch


@runtime_checkable
class Executor(Protocol):
    """Runs steps over a paged KV pool and (hybrid models) recurrent-state slots.

    Memory (fixed for the executor's lifetime):
      num_pages        KV pages; page p holds `page_size` positions of one sequence
      page_size        tokens per page
      num_state_slots  recurrent-state slots (0 for attention-only models); the engine uses
                       slots 0..max_concurrency-1 as lanes and the rest for prefix checkpoints
      is_hybrid        True when the model has recurrent (linear-attention) layers

    `run(batch)` contract:
      1. apply `batch.state_copies` in order (src slot -> dst slot, whole recurrent state);
      2. for each chunk, compute `token_ids` at positions start_pos.. of its sequence, reading
         KV of earlier positions through `block_table` and writing the chunk's KV into it;
         a chunk with start_pos == 0 starts from a zero recurrent state, any other continues
         from its `state_slot` (which holds the state after position start_pos - 1);
      3. return logits [n_rows, vocab] for the chunks with want_logits, in batch order: the
         logits of each such chunk's last position.
    Pages before start_pos are read-only to the chunk (they may be shared by other
    sequences). Raising fails the step's requests; the engine keeps running.
    """

    num_pages: int
    page_size: int
    num_state_slots: int
    is_hybrid: bool

    def run(self, batch: StepBatch) -> Any:  # logits: [n_rows_with_want_logits, vocab]
        ...

    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        """Copy one recurrent-state slot to another now (outside a step)."""
        ...

"""What the engine needs from an executor (the plan executor, or a fake in tests).

No torch import here: the logits are returned as the executor's tensor type and only the
sampler looks inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ninfer.runtime.step import StepBatch


class HostSnapshot(Protocol):
    """An executor's host-memory copy of some KV pages and (optionally) one recurrent-state
    slot, made by `Executor.snapshot`. Opaque to the engine except for its sizes; dropping the
    last reference frees its host memory.

      num_pages     pages saved, in the order given to `snapshot`
      has_state     whether a state slot was saved
      kv_nbytes     host bytes of the KV part (num_pages * kv_bytes_per_page)
      state_nbytes  host bytes of the state part (state_bytes, or 0)
      nbytes        kv_nbytes + state_nbytes
    """

    num_pages: int
    has_state: bool
    kv_nbytes: int
    state_nbytes: int

    @property
    def nbytes(self) -> int: ...


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
         logits of each such chunk's last `num_logits` positions (1 row; k + 1 rows for a
         speculative verify chunk, one target forward for all of them); with `all_logits=True` (the engine's
         `prompt_logits`), every position of every chunk instead.
    An executor with `feeds_tokens = True` also takes `run(batch, fed=ids)` for a batch with
    `fed_rows` (step.py): `ids` is the previous step's sampled token tensor, still on the
    device, and chunk i computes token `ids[batch.fed_rows[i]]` (no host round trip, so the
    engine can queue a decode step before it has read the previous step's tokens).
    Pages before start_pos are read-only to the chunk (they may be shared by other
    sequences). Raising fails the step's requests; the engine keeps running.

    Host snapshots (pausing a request without losing its computed state):
      kv_bytes_per_page  host bytes one page takes in a snapshot (every layer, K and V, scales)
      state_bytes        host bytes of one state slot in a snapshot (0 without recurrent state)
      snapshot(page_ids, state_slot) copies those pages (and slot) to host memory and returns
          the handle; restore(snapshot, page_ids, state_slot) copies it back into other pages
          (as many, in the same order) and another slot. Both are ordered with `run`: a
          snapshot sees every step run before it, a restore is visible to every step after it,
          and the pages and slot may be reused (overwritten) right after `snapshot` returns.
    """

    num_pages: int
    page_size: int
    num_state_slots: int
    is_hybrid: bool
    kv_bytes_per_page: int
    state_bytes: int

    def run(self, batch: StepBatch, all_logits: bool = False) -> Any:  # [n_rows, vocab]
        ...

    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        """Copy one recurrent-state slot to another now (outside a step)."""
        ...

    def copy_page(self, src_page: int, dst_page: int) -> None:
        """Copy one KV page (every layer, K and V, scales) to another now (outside a step),
        ordered with `run` like `copy_state`. Optional: without it the engine never forks a
        choice whose prompt ends inside a page (choices.py)."""
        ...

    def snapshot(self, page_ids: Sequence[int], state_slot: int | None) -> HostSnapshot:
        """Copy KV pages `page_ids` and (not None) recurrent-state slot `state_slot` to host
        memory; mutates nothing on the device."""
        ...

    def restore(
        self, snapshot: HostSnapshot, page_ids: Sequence[int], state_slot: int | None
    ) -> None:
        """Copy `snapshot` into pages `page_ids` (len == snapshot.num_pages, page i of the
        snapshot into page_ids[i]) and, when it holds state, into slot `state_slot`."""
        ...

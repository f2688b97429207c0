"""RankExecutor: rank 0's executor in a tensor-parallel engine.

It is what the engine holds in place of a whole-model executor: every call it takes is first
broadcast to the workers (ranks.py), then run on rank 0's own executor, so all ranks run the
same step in lockstep and meet in its collectives. The logits it returns are whole ([rows,
vocab], gathered in the plan), and rank 0 samples them.

Differences from a whole-model executor, and why:
  - feeds_tokens is False: a step's token ids travel in the broadcast StepBatch, so the engine
    schedules the next step once this one's tokens are on the host (no overlap).
  - no snapshot / restore: each rank would have to keep its own part of a paused request's
    pages; the engine then pauses requests by replay (recomputing them), which needs nothing.
  - a failure of a collective or of a worker fails the group for good (RankFailure), since the
    ranks can no longer be known to agree on the KV contents.
"""

from __future__ import annotations

from typing import Any

from ninfer.parallel.ranks import RankFailure, RankGroup
from ninfer.runtime.step import StepBatch

_NOT_FORWARDED = frozenset({"snapshot", "restore", "feeds_tokens"})


class RankExecutor:
    feeds_tokens = False

    def __init__(self, group: RankGroup, local: Any, owns_group: bool):
        self.group = group
        self.local = local  # rank 0's executor of its own plan
        self.plan = local.plan
        self._owns_group = owns_group
        self._closed = False
        if hasattr(local, "capture_all"):  # CUDA: build_engine captures before serving
            self.capture_all = self._capture_all

    def run(self, batch: StepBatch, all_logits: bool = False, fed: Any = None) -> Any:
        """Executor.run on every rank; rank 0's (whole) logits [rows, vocab]."""
        if fed is not None:
            raise ValueError("a tensor-parallel executor takes its tokens from the batch")
        self.group.send("run", batch, all_logits)
        return self._local(lambda: self.local.run(batch, all_logits=all_logits))

    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        self.group.send("copy_state", src_slot, dst_slot)
        self._local(lambda: self.local.copy_state(src_slot, dst_slot))

    def copy_page(self, src_page: int, dst_page: int) -> None:
        self.group.send("copy_page", src_page, dst_page)
        self._local(lambda: self.local.copy_page(src_page, dst_page))

    def _capture_all(self) -> int:
        """CUDA: capture every decode bucket on every rank (the collectives inside)."""
        self.group.send("capture")
        return int(self._local(self.local.capture_all))

    def _local(self, fn: Any) -> Any:
        try:
            return fn()
        except (ValueError, RankFailure):  # a bad batch is refused alike on every rank
            raise
        except Exception as e:  # a collective failed: the ranks no longer agree
            raise self.group.collective_failed(e) from e

    def close(self) -> None:
        """Unload the model from the workers, or stop them when this executor started them."""
        if self._closed:
            return
        self._closed = True
        if self._owns_group:
            self.group.close()
        elif self.group.failure is None:
            self.group.send("unload")

    def __getattr__(self, name: str) -> Any:
        # the whole-model executor's sizes and counters (num_pages, is_hybrid, tokens_computed…)
        if name in _NOT_FORWARDED or name.startswith("_") or name == "local":
            raise AttributeError(name)
        return getattr(self.local, name)

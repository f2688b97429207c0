"""What a resident sequence hands to the prefix cache as it advances.

    full pages    every page a sequence completes is inserted into the cache tree (when that
                  prefix is cached already the sequence switches to the cached page and frees
                  its own: same tokens at the same positions, same KV)
    checkpoints   hybrid models only. A prefill chunk stops at each caller-marked boundary
                  (`Request.checkpoint_positions`, rounded down to a page) so the lane's
                  recurrent state can be copied into a cache slot there. At the other page
                  boundaries the state goes to the sequence's one private *rolling* slot; when
                  the sequence finishes (or pauses) that slot becomes a cache checkpoint: the
                  retained endpoint a continuation resumes from.

Captures are `StateCopy(lane -> slot)` entries appended to the scheduler's ordered list of
device operations owed to the next step, which runs them before any chunk, so they see the
lane's state exactly at the boundary. No torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.runtime.pages import PagePool
from ninfer.runtime.prefix_cache import PrefixCache, page_key
from ninfer.runtime.sequence import Sequence
from ninfer.runtime.step import StateCopy

if TYPE_CHECKING:
    from ninfer.runtime.preemption import DeviceOp


class Retention:
    """Feeds `cache` (None: prefix reuse off) from sequences; see the module docstring."""

    def __init__(
        self, cache: PrefixCache | None, pool: PagePool, page_size: int, is_hybrid: bool
    ) -> None:
        self.cache = cache
        self.pool = pool
        self.page_size = page_size
        self.checkpoints = cache is not None and is_hybrid

    def split_points(self, seq: Sequence) -> list[int]:
        """Page-aligned positions past `computed` where a hybrid sequence's prefill must stop so
        its state can be checkpointed: the caller's marks, and the prompt's last full page (a
        rolling endpoint, should the request end before its output fills a page)."""
        if not self.checkpoints:
            return []
        ps = self.page_size
        marks = {p // ps * ps for p in seq.request.checkpoint_positions}
        marks.add(seq.num_prompt // ps * ps)
        return sorted(p for p in marks if seq.computed < p < seq.known)

    def retain_full_pages(self, seq: Sequence) -> None:
        """Insert each page `seq` completed since the last call into the cache."""
        if self.cache is None:
            return
        ps = self.page_size
        for i in range(len(seq.nodes), seq.computed // ps):
            parent = seq.nodes[-1] if seq.nodes else None
            key = page_key(seq.tokens, seq.request.media, i, ps)  # media pages: digest + grid
            node = self.cache.insert(parent, key, seq.pages[i])
            if node.page != seq.pages[i]:
                self.pool.retain(node.page)
                self.pool.release([seq.pages[i]])
                seq.pages[i] = node.page
            seq.nodes.append(node)

    def capture(self, seq: Sequence, copies: list[DeviceOp]) -> None:
        """After `seq` advanced: checkpoint its lane's state if it stands on a page boundary
        (a marked one into a cache slot, any other into its rolling slot)."""
        if not self.checkpoints:
            return
        assert self.cache is not None
        pos, ps = seq.computed, self.page_size
        if pos % ps or pos == 0:
            return
        while seq.capture_at and seq.capture_at[0] <= pos:
            seq.capture_at.pop(0)
        node = seq.nodes[pos // ps - 1]
        if node.state_slot is not None:  # this prefix is checkpointed already
            return
        assert seq.slot is not None
        if any(p // ps * ps == pos for p in seq.request.checkpoint_positions):
            slot = self.cache.acquire_slot()
            if slot is not None:
                copies.append(StateCopy(seq.slot, slot))
                self.cache.attach_checkpoint(node, slot, marked=True)
            return
        if seq.rolling_slot is None:  # best effort: never displaces a marked checkpoint
            seq.rolling_slot = self.cache.acquire_slot(evict_marked=False)
        if seq.rolling_slot is not None:
            copies.append(StateCopy(seq.slot, seq.rolling_slot))
            seq.rolling_pos = pos

    def publish_rolling(self, seq: Sequence, session_key: str | None) -> None:
        """Turn the rolling slot into a cache checkpoint at its position (call before the
        sequence lets go of its pages, while its cache nodes are still pinned)."""
        slot, seq.rolling_slot = seq.rolling_slot, None
        if slot is None:
            return
        assert self.cache is not None
        i = seq.rolling_pos // self.page_size - 1
        if 0 <= i < len(seq.nodes):
            self.cache.attach_checkpoint(seq.nodes[i], slot, session_key)
        else:
            self.cache.release_slot(slot)

    def drop_rolling(self, seq: Sequence) -> None:
        """Give the rolling slot back unpublished (its content is not trusted)."""
        if seq.rolling_slot is not None:
            assert self.cache is not None
            self.cache.release_slot(seq.rolling_slot)
            seq.rolling_slot = None

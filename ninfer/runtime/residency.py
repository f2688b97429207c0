"""Who holds the lanes and KV pages: binding a sequence, reserving pages for its next unit
under pressure, pausing it, releasing it. The `Scheduler` (scheduler.py) builds on this and
decides *when* (admission order, planning, commit).

    bind      a free lane; then either the pages of a prefix-cache hit (plus a state copy from
              its checkpoint on a hybrid model) or, for a request paused with a host snapshot,
              fresh pages the snapshot is copied back into (preemption.py)
    reserve   pages for the next unit, oldest resident first: reclaim cached pages, then pause
              the youngest resident; the oldest always progresses
    pause     route snapshot or replay (preemption.py), then give back lane and pages

Every device-side effect (state copies, snapshot transfers) is appended to `_ops` in decision
order; the next step runs them in that order. No torch import.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.pages import PagePool
from ninfer.runtime.preemption import DeviceOp, Preemption, SnapshotIn, SnapshotOut
from ninfer.runtime.prefix_cache import PrefixCache, PrefixMatch
from ninfer.runtime.request import AdmittedEvent, PromptProgressEvent, SchedulingEvent
from ninfer.runtime.retention import Retention
from ninfer.runtime.sequence import SeqStatus, Sequence
from ninfer.runtime.step import StateCopy

if TYPE_CHECKING:
    from ninfer.runtime.scheduler import StepPlan


@dataclass
class SchedulerCounters:
    """Monotonic totals since start (units: tokens, events)."""

    prompt_tokens: int = 0  # full prompts, counted once at initial binding
    cached_tokens: int = 0  # prompt tokens reused at initial binding
    prefill_tokens: int = 0  # prompt tokens computed for the first time
    replayed_tokens: int = 0  # tokens recomputed after pauses
    generation_tokens: int = 0  # committed outputs
    decode_tokens: int = 0  # committed outputs except each request's first
    preemptions: int = 0
    snapshot_restores: int = 0
    replay_restores: int = 0
    steps: int = 0
    decode_rounds: int = 0  # steps with at least one decode row
    decode_rows: int = 0  # decode rows summed over steps
    outcomes: dict[str, int] = field(default_factory=dict)
    # context cache: bindings that consulted the prefix cache, those that reused a prefix and
    # the tokens reused; state images copied lane -> checkpoint slot (captures) and back
    cache_selections: int = 0
    cache_selection_hits: int = 0
    cache_selected_tokens: int = 0
    state_captures: int = 0
    state_restores: int = 0
    last_selection: dict[str, object] | None = None  # a gauge: the latest selection
    # speculative decoding (speculation.py): verify rounds, draft tokens proposed and accepted,
    # decode rows of a speculating engine that ran without drafts
    spec_rounds: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_fallback_steps: int = 0

    def spec_totals(self) -> dict[str, int]:
        """The speculative counters under their EngineStats names."""
        return {
            "spec_decode_rounds_total": self.spec_rounds,
            "spec_decode_draft_tokens_total": self.spec_draft_tokens,
            "spec_decode_accepted_tokens_total": self.spec_accepted_tokens,
            "spec_decode_fallback_steps_total": self.spec_fallback_steps,
        }


class SeqUpdate(NamedTuple):
    """Something to publish: a `notice` (admission, prompt progress), newly committed tokens,
    or (finished=True) the end."""

    seq: Sequence
    new_tokens: tuple[int, ...]
    finished: bool
    notice: AdmittedEvent | PromptProgressEvent | SchedulingEvent | None = None


class Residency:
    """Lanes, the KV page pool, the prefix cache and pause/restore of resident sequences.

    `num_pages`/`page_size`/`num_state_slots`/`is_hybrid` describe the executor's memory. On a
    hybrid model lane i uses state slot i and slots max_concurrency.. hold checkpoints.
    `host_snapshots`: the executor can snapshot (sizes `kv_bytes_per_page`, `state_bytes`), so
    pauses may take the snapshot route within `config.host_context_mib`.
    """

    _updates: list[SeqUpdate]  # the Scheduler's, published by the engine

    def __init__(
        self,
        config: EngineOptions,
        *,
        num_pages: int,
        page_size: int,
        num_state_slots: int = 0,
        is_hybrid: bool = False,
        host_snapshots: bool = False,
        kv_bytes_per_page: int = 0,
        state_bytes: int = 0,
    ) -> None:
        lanes = config.max_concurrency
        assert not is_hybrid or num_state_slots >= lanes, "a hybrid model needs a slot per lane"
        self.config = config
        self.page_size = page_size
        self.is_hybrid = is_hybrid
        self.num_state_slots = num_state_slots if is_hybrid else 0
        # the top lanes * k slots: each lane's extra round slots while speculating
        self.spec_slots = config.compile.spec_state_slots if is_hybrid else 0
        assert not is_hybrid or num_state_slots >= lanes + self.spec_slots, "no round slots"
        self.pool = PagePool(num_pages)
        self.cache: PrefixCache | None = None
        if config.prefix_reuse:
            slots = range(lanes, num_state_slots - self.spec_slots) if is_hybrid else range(0)
            self.cache = PrefixCache(
                self.pool, page_size, needs_checkpoint=is_hybrid, checkpoint_slots=slots
            )
        self.retention = Retention(self.cache, self.pool, page_size, is_hybrid)
        host = config.host_context_bytes(state_bytes) if host_snapshots else 0
        self.preemption = Preemption(host, kv_bytes_per_page, state_bytes, page_size, is_hybrid)
        self.counters = SchedulerCounters()
        self.paused: list[Sequence] = []  # by seq_id (= arrival order)
        self.running: list[Sequence] = []  # by seq_id: oldest first
        self._free_lanes = list(range(lanes - 1, -1, -1))
        self._ops: list[DeviceOp] = []  # device operations owed to the next step, in order

    def _finish(
        self, seq: Sequence, reason: str, now: float, error: BaseException | None = None
    ) -> None:
        raise NotImplementedError  # the Scheduler's

    # -- binding ----------------------------------------------------------------------------

    def _match(self, seq: Sequence) -> PrefixMatch:
        if self.cache is None or seq.saved is not None:  # a snapshot brings its own pages
            return PrefixMatch((), None)
        return self.cache.match(seq.tokens, seq.known - 1, seq.request.media)

    def _fits(self, seq: Sequence, match: PrefixMatch) -> bool:
        """Whether the frontier (plus one more unit when restoring) fits in free pages and
        pages the cache could give back, not counting the pages this match keeps. A restore
        also leaves the residents room for their next token each: otherwise the step that
        plans their units pauses the youngest, the request just restored, before it ran."""
        restoring = seq.status is SeqStatus.PAUSED
        frontier = seq.known + (1 if restoring else 0)
        need = min(self._pages_for(frontier), self.pool.num_pages) - len(match.nodes)
        if restoring:
            need += sum(max(0, self._pages_for(r.known + 1) - len(r.pages)) for r in self.running)
        kept = sum(1 for n in match.nodes if self.pool.refcount(n.page) == 1)
        return need <= self.pool.num_free + self.pool.num_reclaimable - kept

    def _bind(self, seq: Sequence, match: PrefixMatch) -> bool:
        """Give `seq` a lane and its starting pages (`_fits` said yes); sets `computed`.
        Returns True when a host snapshot was restored, False for a prefix match (or none)."""
        seq.lane = self._free_lanes.pop()
        seq.slot = seq.lane if self.is_hybrid else None
        restored = seq.saved is not None
        if seq.saved is not None:  # copy the snapshot back into fresh pages: no recompute
            seq.nodes, seq.pages = [], self._take_pages(seq.saved.num_pages)
            seq.computed = self.preemption.restore(seq, self._ops)
        else:
            self._selected(match)
            for node in match.nodes:
                self.pool.retain(node.page)
            seq.nodes = list(match.nodes)
            seq.pages = [n.page for n in match.nodes]
            seq.computed = len(match.nodes) * self.page_size
            if match.state_slot is not None:  # after pending captures
                self._ops.append(StateCopy(match.state_slot, seq.lane))  # = seq.slot
        seq.capture_at = self.retention.split_points(seq)
        seq.status = SeqStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.seq_id)
        return restored

    def _selected(self, match: PrefixMatch) -> None:
        """Count a binding that consulted the prefix cache (none: there is no cache)."""
        if self.cache is None:
            return
        c, tokens = self.counters, match.num_tokens(self.page_size)
        c.cache_selections += 1
        c.cache_selection_hits += tokens > 0
        c.cache_selected_tokens += tokens
        c.last_selection = {"tokens": tokens, "path": "checkpoint" if tokens else "root",
                            "state_checkpoint": match.state_slot is not None}  # fmt: skip

    def _count_state_copies(self, ops: list[DeviceOp]) -> None:
        """Count the state images a step copies: into a checkpoint slot (slots past the
        lanes) is a capture, into a lane a restore."""
        for op in ops:
            if isinstance(op, StateCopy):
                if op.dst_slot >= self.config.max_concurrency:
                    self.counters.state_captures += 1
                else:
                    self.counters.state_restores += 1

    def _take_pages(self, n: int) -> list[int]:
        """`n` pages, evicting cached ones as needed (the caller checked that they exist)."""
        while self.cache is not None and n > self.pool.num_free:
            if not self.cache.evict_pages(n - self.pool.num_free):
                break
        pages = self.pool.allocate(n)
        assert pages is not None, "admission promised pages that are not there"
        return pages

    def lend_pages(self, tokens: int) -> list[int] | None:
        """Pages for `tokens` positions outside any sequence (the engine's `prompt_logits`),
        evicting cached prefixes as needed; None when the pool cannot hold them. The caller
        gives them back with `pool.release`."""
        need = self._pages_for(tokens)
        if need > self.pool.num_pages or not self._evict_for(need):
            return None
        return self.pool.allocate(need)

    def fail_step(self, plan: StepPlan, now: float, error: BaseException) -> None:
        """The executor raised on `plan` (its transfers or its batch): fail the requests whose
        KV, state or snapshot it was to write, and forget checkpoints its state copies were to
        fill (they hold garbage)."""
        copies = [op for op in plan.transfers if isinstance(op, StateCopy)]
        dst_slots = {c.dst_slot for c in (*copies, *plan.batch.state_copies)}
        if self.cache is not None:
            for slot in dst_slots:
                self.cache.invalidate_slot(slot)
        hit = {s.seq_id: s for s in (*plan.chunk_seqs, *(f.seq for f in plan.forks))}
        for op in plan.transfers:
            if isinstance(op, (SnapshotIn, SnapshotOut)):
                hit[op.seq.seq_id] = op.seq
                self.preemption.abandon(op)
        hit.update({s.seq_id: s for s in self.running if s.slot in dst_slots})
        for seq in list(self.running):
            if seq.rolling_slot in dst_slots:
                hit[seq.seq_id] = seq
        for seq in hit.values():
            if seq.status is not SeqStatus.FINISHED:
                self.retention.drop_rolling(seq)  # its captured state may be garbage
                self._finish(seq, "error", now, error)

    # -- pressure ---------------------------------------------------------------------------

    def _reserve(self, seq: Sequence, end: int, now: float) -> bool:
        """Give `seq` pages through position `end`; reclaim cached pages, then pause younger
        residents. On failure `seq` is paused (or finished with 'length' when it is alone and
        the pool is too small) and False is returned."""
        need = self._pages_for(end) - len(seq.pages)
        while not self._evict_for(need):
            youngest = self.running[-1]
            if youngest is seq:
                if len(self.running) == 1:
                    self._finish(seq, "length", now)
                else:
                    self._pause(seq, now)
                return False
            self._pause(youngest, now)
        self._grant(seq, need)
        return True

    def _reserve_free(self, seq: Sequence, end: int) -> bool:
        """Give `seq` pages through position `end` from free or cached pages only (nobody is
        paused); False when they are not there."""
        need = self._pages_for(end) - len(seq.pages)
        if not self._evict_for(need):
            return False
        self._grant(seq, need)
        return True

    def _evict_for(self, need: int) -> bool:
        """Reclaim cached pages until `need` pages are free; False when there are not enough."""
        while need > self.pool.num_free:
            if self.cache is None or not self.cache.evict_pages(need - self.pool.num_free):
                return False
        return True

    def _grant(self, seq: Sequence, need: int) -> None:
        if need > 0:
            pages = self.pool.allocate(need)
            assert pages is not None
            seq.pages += pages

    def _pause(self, seq: Sequence, now: float) -> None:
        self.retention.publish_rolling(seq, None)
        self.preemption.save(seq, self._ops)  # route: snapshot (sets seq.saved) or replay
        self._release_residence(seq)
        seq.computed = 0
        seq.status = SeqStatus.PAUSED
        seq.paused_since_s = now
        seq.preemptions += 1
        self.counters.preemptions += 1
        bisect.insort(self.paused, seq, key=lambda s: s.seq_id)
        seq.pause_route = "snapshot" if seq.saved is not None else "replay"
        self._transition(seq, "pause_started", now, chosen=False)  # route and copy: at once
        self._transition(seq, "paused", now)

    def _restored(self, seq: Sequence, restored: bool, now: float) -> None:
        """Bookkeeping of a paused request's new binding (`restored`: from its host snapshot,
        else it replays): restore counters, paused time, the cycle's transitions."""
        self._transition(seq, "restore_started", now)
        self.paused.remove(seq)
        if restored:
            seq.snapshot_restores += 1
            self.counters.snapshot_restores += 1
        else:
            seq.replay_restores += 1
            self.counters.replay_restores += 1
        assert seq.paused_since_s is not None
        seq.paused_s += now - seq.paused_since_s
        seq.paused_since_s = None
        seq.recovering = True
        self._transition(seq, "restored", now)

    def _recovery(self, seq: Sequence, was_replaying: bool, fresh: bool, now: float) -> None:
        """After a committed chunk of a restored request: replay_complete when it rebuilt the
        old frontier, recovery_complete at its first fresh unit (past that frontier)."""
        if was_replaying and not seq.replaying:
            self._transition(seq, "replay_complete", now)
        if seq.recovering and fresh:
            seq.recovering = False
            self._transition(seq, "recovery_complete", now)

    def _transition(self, seq: Sequence, boundary: str, now: float, chosen: bool = True) -> None:
        """Publish a pause-cycle boundary of `seq`, with the cycle's route once `chosen`."""
        c = self.counters
        progress = {
            "global": {"prefill_tokens": c.prefill_tokens, "decode_tokens": c.decode_tokens,
                       "replayed_tokens": c.replayed_tokens},
            "request": {"prefill_tokens": seq.prefill_tokens,  # decode: as the global one,
                        "decode_tokens": max(seq.num_output - 1, 0),  # not the first token
                        "replayed_tokens": seq.replayed_tokens},
        }  # fmt: skip
        event = SchedulingEvent(
            boundary, seq.preemptions, seq.pause_route if chosen else None,
            int(now * 1e9), int((now - seq.arrival_s) * 1e9), progress,
        )  # fmt: skip
        self._updates.append(SeqUpdate(seq, (), False, event))

    def _release_residence(self, seq: Sequence) -> None:
        self.pool.release(seq.pages)
        seq.pages = []
        seq.nodes = []
        assert seq.lane is not None
        self._free_lanes.append(seq.lane)
        seq.lane = seq.slot = None
        self.running.remove(seq)

    def round_slots(self, seq: Sequence) -> tuple[int, ...]:
        """The k + 1 state slots of `seq`'s lane a hybrid verify chunk writes (the state after
        its position t into slot t): the lane's own and its k round slots."""
        assert seq.lane is not None and self.spec_slots
        k = self.spec_slots // self.config.max_concurrency
        base = self.num_state_slots - self.spec_slots + seq.lane * k
        return (seq.lane, *range(base, base + k))

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # -- gauges and invariants --------------------------------------------------------------

    @property
    def state_slots_used(self) -> int:
        if not self.is_hybrid:
            return 0
        lanes = self.config.max_concurrency - len(self._free_lanes)
        checkpoints = 0 if self.cache is None else self.cache.num_slots - self.cache.num_free_slots
        return lanes + checkpoints

    def _check_residency(self) -> None:
        """Pages, lanes, cache and host budget agree with the resident and paused sequences."""
        self.pool.check()
        if self.cache is not None:
            self.cache.check()
        refs = [0] * self.pool.num_pages
        for s in self.running:
            assert s.status is SeqStatus.RUNNING and s.lane is not None and s.saved is None
            assert len(s.pages) >= self._pages_for(s.computed)
            assert [n.page for n in s.nodes] == s.pages[: len(s.nodes)]
            for p in s.pages:
                refs[p] += 1
        for p in range(self.pool.num_pages):
            cached = 1 if self.pool.is_cached(p) else 0
            assert self.pool.refcount(p) == refs[p] + cached, p
        lanes = [s.lane for s in self.running] + self._free_lanes
        assert sorted(lanes) == list(range(self.config.max_concurrency))
        self.preemption.check(self.paused, self._ops)

"""Several choices of one prompt (`n` > 1): the prompt computed once and shared by every choice.

The caller submits the choices together (`Engine.submit_choices`). The first, the *leader*, is
an ordinary request; the others wait attached to it as *siblings*, outside the admission queue.
When the scheduler plans the chunk that completes the leader's prompt, it binds each sibling
beside it (a lane, plus one fresh page when the prompt ends inside a page), and the step samples
one more row per sibling: the leader's logits row again, drawn with the sibling's own generator
(its own seed). At that step's commit each sibling stands where a separate request whose whole
prompt was cached would stand, without computing anything::

    leader    pages [A][B][C]     C: the prompt's last, partial page (the leader's own)
    sibling   pages [A][B][C']    A, B shared (one more reference each, copy on write is never
                                  needed: full pages are read-only); C' = PageCopy(C)
              slot  StateCopy(leader's slot) on a hybrid model: the state after the prompt
              computed = the prompt, its first token sampled from the prompt's last logits

Both copies are device operations owed to the next step and run before it, in decision order,
so neither the leader's next token nor a later owner of C writes C before it is copied. The
executor computes the prompt's tokens once for all the choices.

A sibling is bound only when a lane is free and, for a prompt ending inside a page, the pool
has a page without pausing anyone and the executor has `copy_page`. Otherwise (and when the
leader ends before its prompt completes) the sibling becomes an ordinary queued request: it
then reuses the leader's cached full pages and computes the rest. No torch import.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, NamedTuple

from ninfer.runtime.request import AdmittedEvent
from ninfer.runtime.residency import SeqUpdate
from ninfer.runtime.sequence import SeqStatus, Sequence
from ninfer.runtime.step import PageCopy, SeqChunk, StateCopy

if TYPE_CHECKING:
    from collections import deque

    from ninfer.runtime.pages import PagePool
    from ninfer.runtime.residency import SchedulerCounters
    from ninfer.runtime.retention import Retention
    from ninfer.runtime.scheduler import StepPlan


class Fork(NamedTuple):
    """A sibling bound in a step: it samples from logits row `row` (its leader's) and, at the
    commit, copies page `src_page` (None: the prompt fills whole pages) into its last page and
    state slot `src_slot` (None: no recurrent state) into its own."""

    row: int
    seq: Sequence
    src_page: int | None
    src_slot: int | None


def row_map(plan: StepPlan) -> tuple[int, ...] | None:
    """The logits row each of `plan.sample_seqs` samples from (None: row i from row i)."""
    if not plan.forks:
        return None
    return (*range(len(plan.logit_seqs)), *(f.row for f in plan.forks))


class ChoiceForks:
    """Mixed into the Scheduler (which provides the attributes and methods declared at the
    end); see the module docstring."""

    def _init_choices(self, page_copies: bool) -> None:
        """`page_copies`: the executor has `copy_page`."""
        self.page_copies = page_copies
        self._siblings: dict[int, list[Sequence]] = {}  # leader seq id -> attached siblings

    @property
    def attached(self) -> int:
        """Siblings waiting for their leader's prompt (not in `waiting`)."""
        return sum(len(s) for s in self._siblings.values())

    def _attach(self, seq: Sequence, leader_id: int) -> bool:
        """Attach fresh `seq` to the request `leader_id` as a sibling choice; False when it
        cannot be (the leader is gone or has output, or the prompts differ): queue it then."""
        leader = self._seqs.get(leader_id)
        if leader is None or leader.num_output:
            return False
        a, b = leader.request, seq.request
        if (
            a.prompt_only
            or b.prompt_only
            or (a.prompt_token_ids, a.media)
            != (
                b.prompt_token_ids,
                b.media,
            )
        ):
            return False
        self._siblings.setdefault(leader_id, []).append(seq)
        return True

    def _fork(self, seqs: tuple[Sequence, ...], chunks: tuple[SeqChunk, ...]) -> tuple[Fork, ...]:
        """Bind the siblings of every leader whose prompt the planned `chunks` complete; the
        ones that cannot be bound are queued as ordinary requests."""
        forks: list[Fork] = []
        row = -1
        for seq, chunk in zip(seqs, chunks):
            row += chunk.want_logits
            if not chunk.want_logits or seq.seq_id not in self._siblings or seq.num_output:
                continue
            if chunk.start_pos + len(chunk.token_ids) != seq.num_prompt:
                continue
            for sib in self._siblings.pop(seq.seq_id):
                fork = self._bind_sibling(seq, sib, row)
                if fork is None:
                    self.waiting.appendleft(sib)
                else:
                    forks.append(fork)
        return tuple(forks)

    def _bind_sibling(self, leader: Sequence, sib: Sequence, row: int) -> Fork | None:
        full, tail = divmod(leader.num_prompt, self.page_size)
        if not self._free_lanes or (tail and not (self.page_copies and self._evict_for(1))):
            return None
        sib.pages = leader.pages[:full]
        for p in sib.pages:
            self.pool.retain(p)
        if tail:
            page = self.pool.allocate(1)
            assert page is not None
            sib.pages += page
        sib.lane = self._free_lanes.pop()
        sib.slot = sib.lane if self.is_hybrid else None
        sib.status = SeqStatus.RUNNING
        bisect.insort(self.running, sib, key=lambda s: s.seq_id)
        return Fork(row, sib, leader.pages[full] if tail else None, leader.slot)

    def _commit_forks(self, plan: StepPlan, tokens: list | tuple, now: float) -> None:
        """After the commit of `plan`'s chunks: each bound sibling takes the prompt its leader
        computed (the copies owed to the next step) and its first token `tokens[i]`."""
        for fork, token in zip(plan.forks, tokens):
            sib, leader = fork.seq, plan.logit_seqs[fork.row]
            if sib.status is not SeqStatus.RUNNING:
                continue  # aborted while the step ran (its constraint allowed nothing)
            if leader.computed < leader.num_prompt:  # the leader's chunk was not committed
                self._release_residence(sib)
                sib.status = SeqStatus.WAITING
                self.waiting.appendleft(sib)
                continue
            if fork.src_page is not None:
                self._ops.append(PageCopy(fork.src_page, sib.pages[-1]))
            if fork.src_slot is not None:
                assert sib.slot is not None
                self._ops.append(StateCopy(fork.src_slot, sib.slot))
            n = sib.num_prompt
            sib.computed = sib.high_water = n
            self.retention.retain_full_pages(sib)
            sib.admitted_s, sib.cached_tokens, sib.reuse_path = now, n, "checkpoint"
            self.counters.prompt_tokens += n
            self.counters.cached_tokens += n
            self._updates.append(SeqUpdate(sib, (), False, AdmittedEvent(n, n, "checkpoint")))
            self._commit_token(sib, int(token), now)
            self._after_token(sib, int(token), now)

    def _detach(self, seq: Sequence) -> bool:
        """`seq` ends: when it is an attached sibling, detach it (True). When it is a leader
        with attached siblings, they become ordinary queued requests."""
        for sib in reversed(self._siblings.pop(seq.seq_id, [])):
            self.waiting.appendleft(sib)
        for leader_id, sibs in self._siblings.items():
            if seq in sibs:
                sibs.remove(seq)
                if not sibs:
                    del self._siblings[leader_id]
                return True
        return False

    # provided by Scheduler / Residency
    if TYPE_CHECKING:
        _seqs: dict[int, Sequence]
        _free_lanes: list[int]
        _ops: list
        _updates: list[SeqUpdate]
        waiting: deque[Sequence]
        running: list[Sequence]
        pool: PagePool
        retention: Retention
        counters: SchedulerCounters
        page_size: int
        is_hybrid: bool

        def _evict_for(self, need: int) -> bool: ...
        def _release_residence(self, seq: Sequence) -> None: ...
        def _commit_token(self, seq: Sequence, token: int, now: float) -> None: ...
        def _after_token(self, seq: Sequence, token: int, now: float) -> None: ...

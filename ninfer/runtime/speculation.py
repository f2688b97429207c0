"""Speculative rounds in the scheduler: how many drafts a decode row may verify, widening decode
rows into verify chunks, and committing the prefix of a round that verification accepted.

    decode row     tokens (t,)                positions c          1 logits row
    verify chunk   tokens (t, d1, .., dk)     positions c .. c+k   k + 1 logits rows, ONE forward

The engine's speculator (ninfer/spec/speculator.py) asks `spec_window` per decode row, has the
drafter propose, calls `widen`, runs the batch and verifies; `commit` then gets, for a verify
chunk, the tokens verification produced: a1..am, where a_i == d_i for i < m (accepted drafts)
and am is the target's own token (the correction or the bonus). Committing them::

    computed  c -> c + j    KV of t, d1 .. d(j-1) is valid; that of the other drafts is not
    known     n -> n + j    a1 .. aj appended one by one, each through the stop conditions
    j = m, or fewer when a stop / max_tokens / the context / the thinking budget ends the round
    pages holding only positions past the new `computed` (rejected drafts) go back to the pool
    hybrid models: the chunk reads the state from the sequence's slot and writes the state after
    its position t into round slot t (Residency.round_slots: the lane's k + 1 slots); the commit
    makes the slot of the last committed position the sequence's slot. Nothing is copied back.

so the state after a round is exactly the state after j plain decode steps. No torch import.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ninfer.runtime.sequence import SeqStatus, Sequence, SpecCounts
from ninfer.runtime.step import SeqChunk

if TYPE_CHECKING:
    from ninfer.runtime.config import EngineOptions
    from ninfer.runtime.residency import SchedulerCounters
    from ninfer.runtime.retention import Retention
    from ninfer.runtime.scheduler import StepPlan


class SpeculativeRounds:
    """Mixed into the Scheduler (which provides the attributes and methods declared here)."""

    config: EngineOptions
    counters: SchedulerCounters
    retention: Retention
    page_size: int

    def spec_counts(self) -> SpecCounts | None:
        """Fresh counters for a request of a speculating engine (None without --spec)."""
        if self.config.spec is None:
            return None
        k = self.config.draft_tokens
        return SpecCounts(self.config.spec, k, accepted_per_position=[0] * k)

    def spec_window(self, seq: Sequence) -> int:
        """How many drafts `seq`'s decode row may verify this step: up to --draft-tokens,
        leaving room for the target's own token within max_tokens and the context; 0 when it
        is not a decode row of a speculating engine."""
        if seq.spec is None or not seq.decode_ready or seq.request.prompt_only:
            return 0
        if seq.request.sampling.logprobs is not None:  # verify rows report no logprobs
            return 0
        room = min(seq.max_tokens - seq.num_output, self.config.max_context - seq.known) - 1
        return max(0, min(self.config.draft_tokens, room))

    def widen(self, plan: StepPlan, drafts: dict[int, tuple[int, ...]]) -> StepPlan:
        """`plan` with the decode row of each sequence in `drafts` turned into a verify chunk
        of its drafts (at most `spec_window`), its pages reserved from free or cached pages
        only; a row whose pages are not there stays a plain decode row (a fallback step)."""
        chunks = []
        for seq, chunk in zip(plan.chunk_seqs, plan.batch.chunks):
            d = drafts.get(seq.seq_id, ())[: self.spec_window(seq)]
            decode_row = chunk.want_logits and len(chunk.token_ids) == 1
            if (
                d
                and decode_row
                and not plan.batch.fed_rows
                and self._reserve_free(seq, chunk.start_pos + 1 + len(d))
            ):
                chunk = dataclasses.replace(
                    chunk,
                    token_ids=chunk.token_ids + tuple(d),
                    block_table=tuple(seq.pages),
                    num_logits=len(d) + 1,
                    spill_slots=self.round_slots(seq)[: len(d) + 1] if self.is_hybrid else (),
                )
            chunks.append(chunk)
        return plan._replace(batch=dataclasses.replace(plan.batch, chunks=tuple(chunks)))

    def _count_fallback(self, seq: Sequence, chunk: SeqChunk) -> None:
        """A plain decode row of a speculating request (call before it advances)."""
        if seq.spec is not None and len(chunk.token_ids) == 1 and seq.decode_ready:
            seq.spec.fallback_steps += 1
            self.counters.spec_fallback_steps += 1

    def _commit_round(
        self, seq: Sequence, chunk: SeqChunk, tokens: tuple[int, ...], now: float
    ) -> None:
        """Commit verify chunk `chunk` of `seq` given the tokens verification produced (see the
        module docstring)."""
        k, m = len(chunk.token_ids) - 1, len(tokens)
        assert 1 <= m <= k + 1 and tuple(tokens[: m - 1]) == chunk.token_ids[1:m], (chunk, tokens)
        spec = seq.spec
        assert spec is not None
        spec.rounds += 1
        spec.drafted_tokens += k
        spec.accepted_tokens += m - 1
        for i in range(m - 1):
            spec.accepted_per_position[i] += 1
        self.counters.spec_rounds += 1
        self.counters.spec_draft_tokens += k
        self.counters.spec_accepted_tokens += m - 1
        seq.decode_rounds += 1
        replaying = seq.replaying
        for i, token in enumerate(tokens):
            self._advance(seq, 1)  # the position of the token fed before `token`
            if chunk.spill_slots:  # the state after that position: its round slot, no copy
                seq.slot = chunk.spill_slots[i]
            self.retention.retain_full_pages(seq)
            self.retention.capture(seq, self._ops)
            self._commit_token(seq, token, now)
            if i == 0:
                self._recovery(seq, replaying, True, now)
            self._after_token(seq, token, now)
            if seq.status is not SeqStatus.RUNNING or seq.known != seq.computed + 1:
                break  # finished, or a thinking suffix was forced: the rest is not this path
        if seq.status is SeqStatus.RUNNING:
            keep = -(-(seq.computed + 1) // self.page_size)  # through the next decode position
            self.pool.release(seq.pages[keep:])
            del seq.pages[keep:]

    # provided by Scheduler / Residency
    if TYPE_CHECKING:
        from ninfer.runtime.pages import PagePool

        pool: PagePool
        _ops: list

        is_hybrid: bool

        def round_slots(self, seq: Sequence) -> tuple[int, ...]: ...
        def _reserve_free(self, seq: Sequence, end: int) -> bool: ...
        def _advance(self, seq: Sequence, n: int) -> int: ...
        def _commit_token(self, seq: Sequence, token: int, now: float) -> None: ...
        def _after_token(self, seq: Sequence, token: int, now: float) -> None: ...
        def _recovery(self, seq: Sequence, was: bool, fresh: bool, now: float) -> None: ...

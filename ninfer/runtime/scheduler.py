"""Decides what every step computes: admission, chunked prefill, compact decode, KV pressure.

One step, in order (`schedule`)::

    expire   waiting requests past their pending deadline fail with QueueTimeout
    copies   recurrent-state captures from the last commit (lane -> checkpoint slot) go first
    admit    paused requests (original order), then fresh ones (FIFO, bounded bypass), bind a
             free lane while their frontier fits; a prefix-cache hit skips computed pages, a
             host snapshot is copied back
    plan     oldest resident first: a decode row, or a prefill/replay chunk from the step's
             prefill budget; reserve its pages, reclaiming cached pages and then pausing the
             youngest resident when the pool is short
    emit     one StepPlan: the host transfers to run first, then one StepBatch (decode rows,
             then prefill chunks)

and after the executor ran and the sampler chose a token for each logits row (`commit`):
advance `computed`, hand newly full pages and checkpoints to the prefix cache (retention.py),
append the sampled tokens, apply stop conditions (EOS, max_tokens, max_context), and append a
thinking-budget suffix without sampling where the budget ran out (thinking.py).

Published per request, in order: `AdmittedEvent` when initial binding commits (the reused
prefix is exact), a `PromptProgressEvent` after each committed chunk of the initial prefill,
then the committed tokens, then the finish.

A paused request gives back its lane and pages and keeps its tokens. It comes back from a host
snapshot when the host budget held one, else by replaying prompt + committed output
(preemption.py); each boundary of such a cycle is published as a `SchedulingEvent`
(residency.py). Neither resamples or republishes: only the last unit of a replay returns
logits, and they sample a new token.

The scheduler is single-threaded and never imports torch; state changes that callers must
publish accumulate as `SeqUpdate`s (`drain_updates`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

from ninfer.runtime.choices import ChoiceForks, Fork
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.executor_api import Executor
from ninfer.runtime.preemption import DeviceOp
from ninfer.runtime.request import (
    AdmittedEvent,
    EngineOverloaded,
    PromptProgressEvent,
    QueueTimeout,
    Request,
    RequestError,
)
from ninfer.runtime.residency import Residency, SeqUpdate
from ninfer.runtime.sequence import SeqStatus, Sequence, count_unit
from ninfer.runtime.speculation import SpeculativeRounds
from ninfer.runtime.step import FED, SeqChunk, StateCopy, StepBatch
from ninfer.runtime.thinking import ThinkingBudget


class StepPlan(NamedTuple):
    """A batch to run plus the sequence of each chunk (same order). `transfers` must run
    before the batch (`Scheduler.run_transfers`)."""

    batch: StepBatch
    chunk_seqs: tuple[Sequence, ...]
    transfers: tuple[DeviceOp, ...] = ()
    forks: tuple[Fork, ...] = ()  # sibling choices sampling a leader's row (choices.py)

    @property
    def logit_seqs(self) -> tuple[Sequence, ...]:
        """The sequence of each logits row the executor returns, in row order."""
        return tuple(s for s, c in zip(self.chunk_seqs, self.batch.chunks) if c.want_logits)

    @property
    def sample_seqs(self) -> tuple[Sequence, ...]:
        """The sequence of each row sampled: `logit_seqs`, then each fork's (choices.py)."""
        return self.logit_seqs + tuple(f.seq for f in self.forks)


class Scheduler(Residency, SpeculativeRounds, ChoiceForks):
    """Owns every sequence; lanes, pages, prefix cache and pauses come from `Residency`
    (residency.py, where the constructor's memory arguments are described), verify rounds
    from `SpeculativeRounds` (speculation.py), the choices of one prompt from `ChoiceForks`
    (choices.py)."""

    def __init__(
        self,
        config: EngineOptions,
        *,
        eos_ids: frozenset[int] | set[int] | tuple[int, ...] = (),
        page_copies: bool = False,
        **memory: Any,
    ) -> None:
        """`memory`: the executor's memory, Residency's keyword arguments (num_pages, page_size,
        num_state_slots, is_hybrid, host_snapshots, kv_bytes_per_page, state_bytes);
        `page_copies`: the executor has `copy_page`."""
        super().__init__(config, **memory)
        self._init_choices(page_copies)
        self.eos_ids = frozenset(eos_ids)
        self.waiting: deque[Sequence] = deque()  # fresh, FIFO
        self._seqs: dict[int, Sequence] = {}
        self._updates: list[SeqUpdate] = []
        self._next_id = 0
        self._step = 0

    # -- public interface -------------------------------------------------------------------

    def validate(self, request: Request) -> None:
        """Raise RequestError when the request can never be served (checked at submission)."""
        n = len(request.prompt_token_ids)
        if n >= self.config.max_context:
            raise RequestError(
                f"the prompt has {n} tokens but the context limit is {self.config.max_context}"
                " (--max-context); shorten the prompt"
            )
        kv_tokens = self.pool.num_pages * self.page_size
        if n > kv_tokens:
            raise RequestError(
                f"the prompt has {n} tokens but the KV pool holds {kv_tokens} (--kv-capacity);"
                " shorten the prompt"
            )

    @property
    def outstanding(self) -> int:
        """Requests not finished: waiting, resident and paused."""
        return len(self._seqs)

    @property
    def capacity(self) -> int:
        """Most outstanding requests accepted (lanes + pending)."""
        return self.config.max_concurrency + self.config.max_pending_requests

    def add(
        self, request: Request, now: float, seq_id: int | None = None, leader: int | None = None
    ) -> Sequence:
        """Queue a request, or attach it to the request `leader` as another choice of the same
        prompt (choices.py). Raises RequestError (unservable) or EngineOverloaded (full)."""
        self.validate(request)
        if self.outstanding >= self.capacity:
            raise EngineOverloaded(
                f"{self.outstanding} requests are already outstanding (--max-concurrency"
                " + --max-pending-requests); retry later"
            )
        if seq_id is None:
            seq_id = self._next_id
        assert seq_id >= self._next_id and seq_id not in self._seqs, "seq ids must increase"
        self._next_id = seq_id + 1
        arrival = now if request.arrival_s is None else request.arrival_s
        params, n = request.sampling, len(request.prompt_token_ids)
        pool = self.pool.num_pages * self.page_size
        seq = Sequence(
            seq_id=seq_id,
            request=request,
            max_tokens=params.max_tokens or self.config.output_limit(n, None, pool).max_tokens,
            arrival_s=arrival,
            deadline_s=(arrival if request.prepared_from_s is None else request.prepared_from_s)
            + self.config.pending_timeout_ms / 1e3,
            tokens=list(request.prompt_token_ids),
            num_prompt=n,
            capture_at=[],
            thinking=ThinkingBudget.of(request),
            spec=self.spec_counts(),
        )
        self._seqs[seq_id] = seq
        if leader is None or not self._attach(seq, leader):
            self.waiting.append(seq)
        return seq

    def get(self, seq_id: int) -> Sequence | None:
        return self._seqs.get(seq_id)

    def has_work(self) -> bool:
        return bool(self._seqs)

    def drain_updates(self) -> list[SeqUpdate]:
        updates, self._updates = self._updates, []
        return updates

    def abort(
        self,
        seq_id: int,
        reason: str,
        now: float,
        error: BaseException | None = None,
        keep_tokens: int | None = None,
    ) -> bool:
        """Finish a request early (cancel, caller-matched stop string, failure). With
        `keep_tokens`, output beyond that many tokens is dropped from the result. Returns False
        when the request already finished."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            return False
        if keep_tokens is not None and 0 <= keep_tokens < seq.num_output:
            del seq.tokens[seq.num_prompt + keep_tokens :]
            seq.computed = min(seq.computed, seq.known)
        self._finish(seq, reason, now, error)
        return True

    def expire(self, now: float) -> None:
        """Fail fresh requests whose pending deadline passed before admission."""
        for seq in [s for s in self.waiting if now >= s.deadline_s]:
            waited = (now - seq.arrival_s) * 1000.0
            self._finish(
                seq,
                "error",
                now,
                QueueTimeout(
                    f"the request waited {waited:.0f} ms without being admitted"
                    " (--pending-timeout-ms); retry later"
                ),
            )

    def schedule(self, now: float) -> StepPlan | None:
        """Plan the next step (see the module docstring). None when nothing can run now."""
        self.expire(now)
        units: list[tuple[Sequence, int]] = []
        for _ in range(2):  # again when planning freed everything (a lone request hit the pool)
            self._admit(now)
            units = self._plan_units(now)
            if units or self.running:
                break
        if not units:
            return None
        decode = [(s, n) for s, n in units if s.decode_ready]
        prefill = [(s, n) for s, n in units if not s.decode_ready]
        chunks = tuple(self._chunk(s, n) for s, n in decode + prefill)
        seqs = tuple(s for s, _ in decode + prefill)
        forks = self._fork(seqs, chunks) if self._siblings else ()
        # the batch carries the state copies after the last transfer; the caller runs the rest
        k = max(
            (i + 1 for i, op in enumerate(self._ops) if not isinstance(op, StateCopy)), default=0
        )
        copies = tuple(op for op in self._ops[k:] if isinstance(op, StateCopy))
        transfers = tuple(self._ops[:k])
        batch = StepBatch(chunks=chunks, state_copies=copies, step_index=self._step)
        self._count_state_copies(self._ops)
        self._ops = []
        self._step += 1
        self.counters.steps += 1
        if decode:
            self.counters.decode_rounds += 1
            self.counters.decode_rows += len(decode)
        return StepPlan(batch, seqs, transfers, forks)

    def schedule_ahead(self, plan: StepPlan, now: float) -> StepPlan | None:
        """The decode step after `plan`, planned before `plan` is committed (its tokens are
        still on the device): every row of `plan` whose request cannot end at that commit for
        a reason known now, fed the token `plan` samples for it (`StepBatch.fed_rows`). None
        when the next step may differ from that: `plan` is not all decode rows, another request
        is resident or could be admitted, device work is owed, the commit would checkpoint a
        hybrid lane or force a thinking suffix, a row samples with penalties (they read the
        output so far), or its next page is not free without pausing someone.

        `commit(plan)` must come before `commit` of the returned plan; a row whose request
        finishes at the first commit is computed for nothing and dropped at the second."""
        self.expire(now)
        chunks, seqs = plan.batch.chunks, plan.chunk_seqs
        if not chunks or self._ops or len(self.running) != len(seqs):
            return None
        if (self.waiting or self.paused) and self._free_lanes:
            return None
        ps = self.page_size
        rows: list[tuple[Sequence, int, int]] = []
        for row, (seq, chunk) in enumerate(zip(seqs, chunks)):
            if seq.status is not SeqStatus.RUNNING or not seq.decode_ready or not chunk.want_logits:
                return None
            p = seq.request.sampling
            if p.presence_penalty or p.frequency_penalty:
                return None
            if seq.thinking is not None and seq.thinking.open:
                return None
            pos = chunk.start_pos + 1  # computed after the commit; the fed token's position
            if self.retention.checkpoints and pos % ps == 0:
                return None
            if seq.num_output + 1 >= seq.max_tokens or pos + 1 >= self.config.max_context:
                continue  # ends with 'length' at the commit
            rows.append((seq, row, pos))
        if not rows or not all(self._reserve_free(seq, pos + 1) for seq, _, pos in rows):
            return None
        ahead = tuple(
            SeqChunk(
                seq_id=seq.seq_id,
                token_ids=(FED,),
                start_pos=pos,
                block_table=tuple(seq.pages),
                state_slot=seq.slot,
                mrope=seq.mrope,
            )
            for seq, _, pos in rows
        )
        batch = StepBatch(ahead, step_index=self._step, fed_rows=tuple(r for _, r, _ in rows))
        self._step += 1
        self.counters.steps += 1
        self.counters.decode_rounds += 1
        self.counters.decode_rows += len(rows)
        return StepPlan(batch, tuple(seq for seq, _, _ in rows))

    def run_transfers(self, plan: StepPlan, executor: Executor) -> None:
        """Run `plan.transfers` through `executor` (call right before `executor.run`)."""
        self.preemption.run(plan.transfers, executor)

    def commit(self, plan: StepPlan, sampled: list | tuple, now: float) -> None:
        """Apply a finished step: `sampled[i]` is the token chosen for the i-th chunk with
        logits, for a verify chunk the tuple of tokens verification gave (speculation.py),
        then one token per fork (`plan.sample_seqs`)."""
        row = 0
        for seq, chunk in zip(plan.chunk_seqs, plan.batch.chunks):
            chosen = sampled[row] if chunk.want_logits else None
            row += chunk.want_logits
            if seq.status is not SeqStatus.RUNNING:
                continue  # finished while the step ran (ahead of its last commit, or aborted)
            assert seq.computed == chunk.start_pos
            if chunk.num_logits > 1:
                self._commit_round(seq, chunk, tuple(chosen), now)  # type: ignore[arg-type]
                continue
            token = None if chosen is None else int(chosen)  # type: ignore[arg-type]
            self._count_fallback(seq, chunk)
            count_unit(seq, chunk.start_pos, len(chunk.token_ids))
            replaying, frontier = seq.replaying, seq.high_water
            if self._advance(seq, len(chunk.token_ids)):
                self._progress(seq, now)
            self.retention.retain_full_pages(seq)
            self.retention.capture(seq, self._ops)
            fresh = seq.computed > frontier
            if token is not None and seq.known == seq.computed and not seq.request.prompt_only:
                self._commit_token(seq, token, now)
                self._recovery(seq, replaying, fresh, now)  # counting that token, before any end
                self._after_token(seq, token, now)
            else:
                self._recovery(seq, replaying, fresh, now)
                if token is not None and seq.known == seq.computed:  # prompt_only: processed
                    self._finish(seq, "length", now)
        assert row + len(plan.forks) == len(sampled), "one sampled token per sampled row"
        self._commit_forks(plan, sampled[row:], now)

    # -- admission --------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        blocked: Sequence | None = None  # the first candidate that did not fit
        for seq in self.paused + list(self.waiting):
            if not self._free_lanes:
                return
            if blocked is not None and blocked.bypassed >= self.config.admission_bypass:
                return
            match = self._match(seq)
            if not self._fits(seq, match):
                blocked = blocked or seq
                continue
            t0 = time.perf_counter()
            restored = self._bind(seq, match)
            if seq.paused_since_s is None:
                seq.bind_s = time.perf_counter() - t0
            self._admitted(seq, restored, now)
            if blocked is not None:
                blocked.bypassed += 1

    def _admitted(self, seq: Sequence, restored: bool, now: float) -> None:
        """Bookkeeping of a bind: restore counters of a paused request, or the initial
        binding of a fresh one (usage and its AdmittedEvent)."""
        if seq.paused_since_s is not None:
            self._restored(seq, restored, now)
            return
        self.waiting.remove(seq)
        seq.admitted_s = now
        seq.cached_tokens = seq.computed
        seq.reuse_path = "checkpoint" if seq.computed else "root"
        self.counters.prompt_tokens += seq.num_prompt
        self.counters.cached_tokens += seq.computed
        admitted = AdmittedEvent(seq.num_prompt, seq.cached_tokens, seq.reuse_path)
        self._updates.append(SeqUpdate(seq, (), False, admitted))

    # -- planning ---------------------------------------------------------------------------

    def _plan_units(self, now: float) -> list[tuple[Sequence, int]]:
        """Oldest first: how many tokens each resident computes this step, pages reserved."""
        budget = min(self.config.prefill_chunk, self.config.max_context)  # as the workspace
        units: list[tuple[Sequence, int]] = []
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING:  # paused for an older one this step
                continue
            n = 1 if seq.decode_ready else self._prefill_length(seq, budget)
            if n == 0 or not self._reserve(seq, seq.computed + n, now):
                continue
            if not seq.decode_ready:
                budget -= n
            units.append((seq, n))
        return units

    def _prefill_length(self, seq: Sequence, budget: int) -> int:
        n = min(seq.known - seq.computed, budget)
        for p in seq.capture_at:
            if p > seq.computed:
                return min(n, p - seq.computed)
        return n

    def _chunk(self, seq: Sequence, n: int) -> SeqChunk:
        start, end = seq.computed, seq.computed + n
        return SeqChunk(
            seq_id=seq.seq_id,
            token_ids=tuple(seq.tokens[start:end]),
            start_pos=start,
            block_table=tuple(seq.pages),
            state_slot=seq.slot,
            want_logits=end == seq.known,
            media=seq.media_in(start, end),
            mrope=seq.mrope,
        )

    # -- commit -----------------------------------------------------------------------------

    def _advance(self, seq: Sequence, n: int) -> int:
        """Account `n` computed tokens; returns how many were prompt tokens computed for the
        first time (initial prefill, not replay)."""
        start, end = seq.computed, seq.computed + n
        replayed = max(0, min(end, seq.high_water) - start)
        fresh_prompt = max(0, min(end, seq.num_prompt) - max(start, seq.high_water))
        seq.replayed_tokens += replayed
        seq.prefill_tokens += fresh_prompt
        self.counters.replayed_tokens += replayed
        self.counters.prefill_tokens += fresh_prompt
        seq.computed = end
        seq.high_water = max(seq.high_water, end)
        return fresh_prompt

    def _progress(self, seq: Sequence, now: float) -> None:
        assert seq.admitted_s is not None
        done, total = min(seq.computed, seq.num_prompt), seq.num_prompt
        event = PromptProgressEvent(total, seq.cached_tokens, done, now - seq.admitted_s)
        self._updates.append(SeqUpdate(seq, (), False, event))

    def _commit_token(self, seq: Sequence, token: int, now: float) -> None:
        seq.tokens.append(token)
        self.counters.generation_tokens += 1
        if seq.num_output > 1:
            self.counters.decode_tokens += 1
        if seq.first_token_s is None:
            seq.first_token_s = now
        seq.last_token_s = now
        self._updates.append(SeqUpdate(seq, (token,), False))

    def _after_token(self, seq: Sequence, token: int, now: float) -> None:
        """The stop conditions after a committed token: EOS, max_tokens, the context, and the
        thinking budget."""
        if token in self.eos_ids and not seq.request.sampling.ignore_eos:
            self._finish(seq, "stop", now)
        elif seq.num_output >= seq.max_tokens or seq.known >= self.config.max_context:
            self._finish(seq, "length", now)
        elif seq.thinking is not None and seq.thinking.observe(token):
            self._force_thinking_close(seq, now)

    def _force_thinking_close(self, seq: Sequence, now: float) -> None:
        """The thinking budget ran out with the block open: commit the suffix unsampled (the
        next step computes it like prompt tokens), or end with 'length' when the suffix and one
        more token do not fit, rather than insert part of it."""
        assert seq.thinking is not None
        suffix = seq.thinking.take_suffix()
        room = min(seq.max_tokens - seq.num_output, self.config.max_context - seq.known)
        if len(suffix) + 1 > room:
            self._finish(seq, "length", now)
            return
        seq.tokens.extend(suffix)
        seq.last_token_s = now
        self.counters.generation_tokens += len(suffix)
        self.counters.decode_tokens += len(suffix)
        self._updates.append(SeqUpdate(seq, suffix, False))

    def _finish(
        self, seq: Sequence, reason: str, now: float, error: BaseException | None = None
    ) -> None:
        detached = self._detach(seq) if self._siblings else False  # choices.py
        if seq.status is SeqStatus.RUNNING:
            self.retention.publish_rolling(seq, seq.request.session_key)
            self._release_residence(seq)
        elif seq.status is SeqStatus.WAITING and not detached:
            self.waiting.remove(seq)
        elif seq.status is SeqStatus.PAUSED:
            self.paused.remove(seq)
            self.preemption.drop(seq)
            if seq.paused_since_s is not None:
                seq.paused_s += now - seq.paused_since_s
        if seq.preemptions:  # the pause cycle's terminal boundary, on the engine clock
            self._transition(seq, "terminal", now)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
        seq.finished_s = now
        del self._seqs[seq.seq_id]
        self.counters.outcomes[reason] = self.counters.outcomes.get(reason, 0) + 1
        self._updates.append(SeqUpdate(seq, (), True))

    # -- invariants -------------------------------------------------------------------------

    def check(self) -> None:
        """Verify cross-structure invariants (tests call this after every step)."""
        self._check_residency()
        queued = len(self.waiting) + self.attached
        assert len(self.running) + len(self.paused) + queued == len(self._seqs)

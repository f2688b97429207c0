"""A deterministic stand-in for the plan executor, for scheduler and engine tests.

Its "model" is a pure function of a sequence's full token history: logits = randn(vocab)
seeded by a hash of the history. The history is *not* taken from the scheduler's bookkeeping:
the fake rebuilds it from the tokens it wrote into the KV pages named by the chunk's block
table (and, for the hybrid variant, checks that the state slot holds exactly the digest of that
history). A wrong block table, a reused page that was overwritten, a bad prefix hit or a wrong
state restore therefore changes the logits, and the generated tokens diverge from the
reference computed by `reference_tokens`, which runs the same function without any engine.

A host snapshot (`snapshot` / `restore`) copies the tokens written in the named pages and the
state slot's digest; a restore into the wrong pages or slot is caught the same way. Live
snapshots are tracked weakly (`live_snapshots`), so tests can check that none leaked.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.runtime.request import SCHEDULING_BOUNDARIES, SamplingParams, SchedulingEvent
from ninfer.runtime.step import FED, StateCopy, StepBatch

_MOD = (1 << 61) - 1


def digest(tokens: Sequence[int]) -> int:
    """Polynomial hash of a token history (the fake recurrent state)."""
    h = 7
    for t in tokens:
        h = (h * 1_000_003 + t + 1) % _MOD
    return h


def logits_for(history: Sequence[int], vocab: int) -> torch.Tensor:
    """The fake model: logits [vocab] as a pure function of the whole history."""
    gen = torch.Generator().manual_seed(digest(history) ^ len(history))
    return torch.randn(vocab, generator=gen)


@dataclass(eq=False)
class FakeSnapshot:
    """Host copy of some pages (the tokens written at each offset) and one state digest."""

    pages: list[list[int | None]]
    state: tuple[int, int] | None
    has_state: bool
    kv_nbytes: int
    state_nbytes: int

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def nbytes(self) -> int:
        return self.kv_nbytes + self.state_nbytes


class FakeExecutor:
    """Implements the `Executor` protocol over python lists, fed tokens included
    (`feeds_tokens=False` makes the engine wait for every step's tokens). `fail_steps` makes
    those step indices raise. `batches` records every StepBatch run; `transfers` every snapshot and
    restore, as ("snapshot" | "restore", page_ids, state_slot). `page_bytes` / `state_bytes`
    set the sizes the fake claims for host snapshots (to exercise a budget in MiB)."""

    TOKEN_BYTES = 8  # pretend KV bytes per position (every layer, K and V)
    STATE_BYTES = 64  # pretend bytes of one recurrent-state slot

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        vocab: int = 32,
        *,
        is_hybrid: bool = False,
        num_state_slots: int = 0,
        fail_steps: Sequence[int] = (),
        page_bytes: int | None = None,
        state_bytes: int | None = None,
        feeds_tokens: bool = True,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.vocab = vocab
        self.is_hybrid = is_hybrid
        self.num_state_slots = num_state_slots if is_hybrid else 0
        self.kv: list[list[int | None]] = [[None] * page_size for _ in range(num_pages)]
        self.state: list[tuple[int, int] | None] = [None] * self.num_state_slots
        self.fail_steps = set(fail_steps)
        self.feeds_tokens = feeds_tokens  # the engine may schedule a decode step ahead
        self.batches: list[StepBatch] = []
        self.runs = 0
        self.kv_bytes_per_page = page_size * self.TOKEN_BYTES if page_bytes is None else page_bytes
        state_bytes = self.STATE_BYTES if state_bytes is None else state_bytes
        self.state_bytes = state_bytes if is_hybrid else 0
        self.transfers: list[tuple[str, tuple[int, ...], int | None]] = []
        self.live_snapshots: weakref.WeakSet[FakeSnapshot] = weakref.WeakSet()

    def snapshot(self, page_ids: Sequence[int], state_slot: int | None) -> FakeSnapshot:
        assert self.is_hybrid == (state_slot is not None), "state slot iff a hybrid model"
        state = None
        if state_slot is not None:
            assert 0 <= state_slot < self.num_state_slots
            state = self.state[state_slot]
            assert state is not None, "snapshot of a state slot never written"
        self.transfers.append(("snapshot", tuple(page_ids), state_slot))
        snap = FakeSnapshot(
            pages=[list(self.kv[p]) for p in page_ids],
            state=state,
            has_state=state_slot is not None,
            kv_nbytes=len(page_ids) * self.kv_bytes_per_page,
            state_nbytes=self.state_bytes if state_slot is not None else 0,
        )
        self.live_snapshots.add(snap)
        return snap

    def restore(
        self, snapshot: FakeSnapshot, page_ids: Sequence[int], state_slot: int | None
    ) -> None:
        assert len(page_ids) == snapshot.num_pages, "restore into a different number of pages"
        assert snapshot.has_state == (state_slot is not None)
        self.transfers.append(("restore", tuple(page_ids), state_slot))
        for p, tokens in zip(page_ids, snapshot.pages):
            self.kv[p] = list(tokens)
        if state_slot is not None:
            assert 0 <= state_slot < self.num_state_slots
            self.state[state_slot] = snapshot.state

    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        self.state[dst_slot] = self.state[src_slot]

    def copy_page(self, src_page: int, dst_page: int) -> None:
        assert 0 <= src_page < self.num_pages and 0 <= dst_page < self.num_pages
        self.transfers.append(("copy_page", (src_page, dst_page), None))
        self.kv[dst_page] = list(self.kv[src_page])

    def run(self, batch: StepBatch, fed: torch.Tensor | None = None) -> torch.Tensor:
        self.runs += 1
        if batch.fed_rows:  # a step scheduled ahead: its tokens are the last step's samples
            assert self.feeds_tokens and fed is not None, "fed rows without the sampled ids"
            assert all(c.token_ids == (FED,) for c in batch.chunks)
            chunks = [
                dataclasses.replace(c, token_ids=(int(fed[r]),))
                for c, r in zip(batch.chunks, batch.fed_rows)
            ]
            batch = dataclasses.replace(batch, chunks=tuple(chunks))
        else:
            assert fed is None
        if batch.step_index in self.fail_steps:
            raise RuntimeError(f"injected failure at step {batch.step_index}")
        self.batches.append(batch)
        for c in batch.state_copies:
            self.copy_state(c.src_slot, c.dst_slot)
        seen: set[int] = set()
        rows = []
        for chunk in batch.chunks:
            assert chunk.seq_id not in seen, "a sequence appears twice in one batch"
            seen.add(chunk.seq_id)
            history = [self._read(chunk.block_table, p) for p in range(chunk.start_pos)]
            self._check_state(chunk.state_slot, chunk.start_pos, history)
            for i, t in enumerate(chunk.token_ids):
                self._write(chunk.block_table, chunk.start_pos + i, t)
            full = history + list(chunk.token_ids)
            if self.is_hybrid:
                assert chunk.state_slot is not None
                self.state[chunk.state_slot] = (len(full), digest(full))
            if chunk.want_logits:
                rows.append(logits_for(full, self.vocab))
        return torch.stack(rows) if rows else torch.empty(0, self.vocab)

    def _check_state(self, slot: int | None, start: int, history: list[int]) -> None:
        if not self.is_hybrid:
            assert slot is None
            return
        assert slot is not None and 0 <= slot < self.num_state_slots
        if start > 0:  # continuing: the slot must hold the state after `history`
            assert self.state[slot] == (start, digest(history)), "stale recurrent state"

    def _read(self, table: tuple[int, ...], pos: int) -> int:
        page, off = table[pos // self.page_size], pos % self.page_size
        token = self.kv[page][off]
        assert token is not None, f"read of unwritten KV at page {page} offset {off}"
        return token

    def _write(self, table: tuple[int, ...], pos: int, token: int) -> None:
        assert pos // self.page_size < len(table), "block table does not cover the chunk"
        self.kv[table[pos // self.page_size]][pos % self.page_size] = token


def reference_tokens(
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    vocab: int,
    eos_ids: Sequence[int],
    max_context: int,
    default_max_tokens: int = 8192,
) -> list[int]:
    """What a request must produce: the fake model run alone, token by token, no engine."""
    sampler = Sampler()
    history = list(prompt)
    out: list[int] = []
    limit = params.max_tokens or default_max_tokens
    while True:
        logits = logits_for(history, vocab)[None]
        token = sampler.sample(logits, [SampleRow(0, params, out)])[0]
        out.append(token)
        history.append(token)
        if token in eos_ids and not params.ignore_eos:
            return out
        if len(out) >= limit or len(history) >= max_context:
            return out


def prompt(n: int, seed: int = 1) -> list[int]:
    """A deterministic prompt of `n` ids in 1..31 (never 0, the harnesses' EOS id)."""
    return [(seed * 7 + i * 13) % 31 + 1 for i in range(n)]


def greedy_sample(logits: torch.Tensor) -> list[int]:
    return logits.argmax(dim=-1).tolist()


class SchedulerHarness:
    """Drives a Scheduler with a FakeExecutor and greedy/seeded sampling, checking every
    invariant after each step and collecting what each request published."""

    def __init__(
        self,
        config,
        *,
        vocab: int = 32,
        is_hybrid: bool = False,
        eos_ids=(0,),
        snapshots=True,
        overlap=False,
        **executor_options,
    ):
        """`snapshots`: whether the scheduler may pause by host snapshot; `overlap`: run the
        next decode step before committing the last, as the engine does
        (`Scheduler.schedule_ahead`); `executor_options` go to the FakeExecutor (page_bytes,
        state_bytes)."""
        from ninfer.runtime.scheduler import Scheduler

        self.config = config
        self.vocab = vocab
        self.eos_ids = tuple(eos_ids)
        slots = config.num_state_slots if is_hybrid else 0
        self.ex = FakeExecutor(
            config.num_pages,
            config.page_size,
            vocab,
            is_hybrid=is_hybrid,
            num_state_slots=slots,
            **executor_options,
        )
        self.sched = Scheduler(
            config,
            num_pages=config.num_pages,
            page_size=config.page_size,
            num_state_slots=slots,
            is_hybrid=is_hybrid,
            eos_ids=self.eos_ids,
            page_copies=True,
            host_snapshots=snapshots,
            kv_bytes_per_page=self.ex.kv_bytes_per_page,
            state_bytes=self.ex.state_bytes,
        )
        self.sampler = Sampler()
        self.now = 0.0
        self.published: dict[int, list[int]] = {}
        self.notices: dict[int, list] = {}  # AdmittedEvent / PromptProgressEvent, in order
        self.finished: dict[int, object] = {}
        self.plans: list = []
        self.overlap = overlap
        self.inflight = None  # (plan, SampledTokens) run ahead, not committed
        self.ahead_steps = 0

    def add(self, prompt, **params):
        from ninfer.runtime.request import Request

        checkpoints = params.pop("checkpoint_positions", ())
        session = params.pop("session_key", None)
        leader = params.pop("leader", None)  # another choice of that request's prompt
        thinking = {k: params.pop(k) for k in list(params) if k.startswith("thinking_")}
        params.setdefault("temperature", 0.0)
        req = Request(tuple(prompt), SamplingParams(**params), checkpoints, session, **thinking)
        seq = self.sched.add(req, self.now, leader=leader)
        self.published[seq.seq_id] = []
        self.notices[seq.seq_id] = []
        return seq

    def _launch(self, plan, fed=None):
        self.sched.run_transfers(plan, self.ex)
        logits = self.ex.run(plan.batch, None if fed is None else fed.ids)
        from ninfer.runtime.choices import row_map

        rows = [SampleRow(s.seq_id, s.request.sampling, s.output_ids) for s in plan.sample_seqs]
        return plan, self.sampler.sample_async(logits, rows, None, row_map(plan))

    def step(self):
        """Commit one step (with `overlap`, first run the next one ahead when the scheduler
        can plan it); returns the committed plan, None when nothing could run."""
        current, self.inflight = self.inflight, None
        if current is None:
            plan = self.sched.schedule(self.now)
            current = None if plan is None else self._launch(plan)
        if current is not None:
            plan, tokens = current
            ahead = self.sched.schedule_ahead(plan, self.now) if self.overlap else None
            if ahead is not None:
                self.inflight = self._launch(ahead, tokens)
                self.ahead_steps += 1
            self.sched.commit(plan, tokens.tolist(), self.now)
            self.plans.append(plan)
        else:
            plan = None
        self.sched.check()
        self.check_checkpoints()
        self.collect()
        return plan

    def check_checkpoints(self):
        """Every checkpoint the cache holds, and every rolling slot, contains (once the copies
        owed to the next batch have run) exactly the state after the tokens it claims."""
        if not self.ex.is_hybrid:
            return
        state = list(self.ex.state)
        for c in self.sched._ops:  # owed to the next step
            if isinstance(c, StateCopy):
                state[c.dst_slot] = state[c.src_slot]
        cache = self.sched.cache
        for node in [] if cache is None else cache._nodes:
            if node.state_slot is not None:
                path, n = [], node
                while n is not None:
                    path[:0] = n.key
                    n = n.parent
                assert state[node.state_slot] == (len(path), digest(path)), "bad checkpoint"
        for seq in self.sched.running:
            if seq.rolling_slot is not None:
                history = seq.tokens[: seq.rolling_pos]
                assert state[seq.rolling_slot] == (len(history), digest(history)), "bad rolling"

    def collect(self):
        for seq, tokens, finished, notice in self.sched.drain_updates():
            assert seq.seq_id not in self.finished, "update after finish"
            if notice is not None:
                # admission and prompt progress precede the first token; pause cycles may not
                if not isinstance(notice, SchedulingEvent):
                    assert not self.published[seq.seq_id], "a notice after the first token"
                self.notices[seq.seq_id].append(notice)
            self.published[seq.seq_id].extend(tokens)
            if finished:
                self.finished[seq.seq_id] = seq

    def cancel_or_step(self, op: tuple, seqs: list) -> None:
        """The random tests' shared operations: ("cancel", i) aborts request i (modulo the
        requests so far, none when there are none); ("step", n) runs n steps. Others are
        the caller's."""
        if op[0] == "cancel" and seqs:
            self.sched.abort(seqs[op[1] % len(seqs)].seq_id, "cancelled", self.now)
            self.collect()
        elif op[0] == "step":
            for _ in range(op[1]):
                self.step()

    def run(self, max_steps: int = 20_000):
        for _ in range(max_steps):
            if not self.sched.has_work() and self.inflight is None:
                return
            self.step()
        raise AssertionError("the scheduler did not finish")

    def reference(self, seq) -> list[int]:
        return reference_tokens(
            seq.request.prompt_token_ids,
            seq.request.sampling,
            vocab=self.vocab,
            eos_ids=self.eos_ids,
            max_context=self.config.max_context,
            default_max_tokens=self.config.default_max_tokens,
        )

    def assert_correct(self, seq):
        """The request published exactly its committed output, which is the reference (or a
        prefix of it, when it was cancelled or the KV pool ended it with 'length')."""
        out = seq.output_ids
        assert self.published[seq.seq_id] == out
        ref = self.reference(seq)
        if seq.finish_reason == "length" and len(out) < len(ref):
            # only legitimate when the whole KV pool could not hold the next position
            assert seq.known == self.config.num_pages * self.config.page_size + 1
            assert out == ref[: len(out)], (out, ref)
        elif seq.finish_reason in ("cancelled", "error"):
            assert out == ref[: len(out)], (out, ref)
        else:
            assert out == ref, (seq.finish_reason, out, ref)


def check_cycles(h: SchedulerHarness, seq) -> None:
    """Each pause cycle of `seq` (its SchedulingEvents in `h`) publishes pause_started (no
    route yet), paused, restore_started, restored, replay_complete (when it had positions to
    recompute: a replay past any prefix hit, or a snapshot taken mid-replay), then
    recovery_complete, with its index and route, on a clock that never goes back. A cycle
    paused again (or ended) before its first fresh unit stops early; the last cycle of a
    request that ran to its end recovered."""
    events = [n for n in h.notices[seq.seq_id] if isinstance(n, SchedulingEvent)]
    if seq.preemptions and seq.finish_reason is not None:  # then its terminal boundary, last
        *events, terminal = events
        assert (terminal.boundary, terminal.preemption_index) == ("terminal", seq.preemptions)
        assert set(terminal.progress) == {"global", "request"}
        assert not events or terminal.steady_ns >= events[-1].steady_ns
    assert all(e.boundary != "terminal" for e in events)
    cycles = [[e for e in events if e.preemption_index == k] for k in range(1, seq.preemptions + 1)]
    assert sum(map(len, cycles)) == len(events)
    routes = []
    for k, cycle in enumerate(cycles, 1):
        names = [e.boundary for e in cycle]
        route = cycle[1].route
        routes.append(route)
        want = list(SCHEDULING_BOUNDARIES[:-1])  # replay_complete: if it recomputed anything
        tails = ([], want[4:-1], want[4:], want[-1:])  # cut short, (no) replay, recovered
        restored = names[2:4] == want[2:4] and names[4:] in tails
        assert names[:2] == want[:2] and (names[2:] == [] or restored), names
        assert cycle[0].route is None and {e.route for e in cycle[1:]} == {route}
        assert [e.steady_ns for e in cycle] == sorted(e.steady_ns for e in cycle)
        assert all(e.elapsed_ns >= 0 for e in cycle)
        assert all(
            e.progress["global"]["replayed_tokens"] >= e.progress["request"]["replayed_tokens"]
            for e in cycle
        )
        if k == len(cycles) and seq.finish_reason in ("stop", "length"):
            assert names[-1] == "recovery_complete", names
            # its first fresh unit is in the progress it reports (a decode step: one token more
            # than the frontier restored had)
            first_fresh, rest = cycle[-1].progress["request"], cycle[3].progress["request"]
            assert first_fresh["decode_tokens"] + first_fresh["prefill_tokens"] > (
                rest["decode_tokens"] + rest["prefill_tokens"]
            ), (first_fresh, rest)
    restores = ["snapshot"] * seq.snapshot_restores + ["replay"] * seq.replay_restores
    assert sorted(r for r, c in zip(routes, cycles) if len(c) > 2) == sorted(restores)

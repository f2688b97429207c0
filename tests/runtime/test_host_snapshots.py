"""Pause and restore by host snapshot and by replay, with the fake executor.

The fake snapshots the tokens written in a request's pages plus its state digest, and computes
every logit from what its pages and slot hold, so a snapshot restored into the wrong pages or
slot, a stale copy, or a missed recompute changes the tokens. Whatever the route, a request
must produce exactly what it produces alone, publish each token once, and give back every
page, lane, slot and host byte.

The fake claims 256 KiB per page and 128 KiB per state image, so a budget of a few MiB holds
only some snapshots: both routes then happen in one run.
"""

from __future__ import annotations

import gc
import itertools
import logging

import pytest
from fake_executor import FakeExecutor, SchedulerHarness, check_cycles, prompt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.errors import ConfigError
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.preemption import D2H, H2D, KV, STATE
from ninfer.runtime.request import (
    EngineError,
    EngineOverloaded,
    Request,
    SamplingParams,
    SchedulingEvent,
)
from ninfer.runtime.sequence import SeqStatus
from ninfer.runtime.step import StateCopy

PAGE_BYTES, STATE_BYTES = 256 << 10, 128 << 10
MIB = 1 << 20
T = 20  # seconds: generous bound for any wait


def harness(hybrid: bool = False, snapshots: bool = True, **cfg) -> SchedulerHarness:
    cfg.setdefault("page_size", 4)
    cfg.setdefault("max_context", 256)
    return SchedulerHarness(
        EngineOptions.of(**cfg),
        is_hybrid=hybrid,
        eos_ids=(0,),
        snapshots=snapshots,
        page_bytes=PAGE_BYTES,
        state_bytes=STATE_BYTES,
    )


def check_all_given_back(h: SchedulerHarness) -> None:
    """Nothing leaked: no request left, pages held only by the prefix cache, every lane free,
    no host byte used or reserved, no snapshot alive in the executor."""
    s = h.sched
    assert not s.running and not s.paused and not s.waiting
    assert all(isinstance(op, StateCopy) for op in s._ops)  # at most captures owed
    assert s.pool.num_used == s.pool.num_reclaimable
    assert sorted(s._free_lanes) == list(range(s.config.max_concurrency))
    assert s.state_slots_used == (0 if s.cache is None else s.cache.num_checkpoints)
    budget = s.preemption.budget
    assert budget.used == budget.reserved == 0
    assert budget.peak <= budget.capacity
    assert_no_live_snapshots(h.ex)


def assert_no_live_snapshots(ex: FakeExecutor) -> None:
    """No snapshot the executor handed out is still alive. A collection can only empty the
    weak set, so it runs only when the set is not empty already: a full collection walks the
    whole test session's heap (0.2-0.4 s each), which was most of the random test's time."""
    if ex.live_snapshots:
        gc.collect()  # a snapshot held only by a reference cycle is not a leak
    assert not ex.live_snapshots


def check_routes(h: SchedulerHarness, seqs) -> None:
    """Every pause ended in exactly one restore (or the request ended while paused), and the
    executor's copies match the counters byte for byte."""
    c = h.sched.counters
    for s in seqs:
        ended_paused = s.paused_since_s is not None
        assert s.preemptions == s.snapshot_restores + s.replay_restores + ended_paused
    assert c.preemptions == sum(s.preemptions for s in seqs)
    assert c.snapshot_restores == sum(s.snapshot_restores for s in seqs)
    assert c.replay_restores == sum(s.replay_restores for s in seqs)
    assert c.replayed_tokens == sum(s.replayed_tokens for s in seqs)
    restores = [t for t in h.ex.transfers if t[0] == "restore"]
    snapshots = [t for t in h.ex.transfers if t[0] == "snapshot"]
    assert len(restores) == c.snapshot_restores <= len(snapshots)
    moved = h.sched.preemption.transfer_bytes
    assert moved.get((KV, H2D), 0) == sum(len(t[1]) for t in restores) * PAGE_BYTES
    assert moved.get((KV, D2H), 0) == sum(len(t[1]) for t in snapshots) * PAGE_BYTES
    state_images = len(snapshots) if h.ex.is_hybrid else 0
    assert moved.get((STATE, D2H), 0) == state_images * STATE_BYTES


# -- property: random pressure, both routes ---------------------------------------------------


@st.composite
def setups(draw):
    ps = draw(st.integers(2, 4))
    config = EngineOptions.of(
        max_concurrency=draw(st.integers(2, 3)),
        max_pending_requests=32,
        page_size=ps,
        kv_capacity=ps * draw(st.integers(4, 9)),
        max_context=64,
        prefill_chunk=draw(st.integers(1, 9)),
        prefix_reuse=draw(st.booleans()),
        device_state_slots=draw(st.integers(0, 3)),
        # 0: replay only; 1-2 MiB: 2-8 pages' worth, so both routes; None: the default 8 GiB
        host_context_mib=draw(st.sampled_from([0, 1, 2, None])),
    )
    return config, draw(st.booleans())


submit = st.tuples(
    st.just("submit"),
    st.integers(1, 30),  # prompt length
    st.integers(1, 9),  # seed
    st.integers(4, 24),  # max_tokens
    st.booleans(),  # sampled vs greedy
)
# a burst of requests first (so they compete for the pool), then anything
ops = st.lists(submit, min_size=2, max_size=4).flatmap(
    lambda first: st.lists(
        st.one_of(
            submit,
            st.tuples(st.just("cancel"), st.integers(0, 20)),
            st.tuples(st.just("step"), st.integers(1, 6)),
        ),
        max_size=16,
    ).map(lambda rest: first + rest)
)


# 70 scenarios: 120 took 80 s of the CPU suite's 15-minute budget (the slowest test in it)
@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups(), ops)
def test_random_pressure_restores_the_same_tokens_by_either_route(setup, operations):
    config, hybrid = setup
    h = SchedulerHarness(config, is_hybrid=hybrid, page_bytes=PAGE_BYTES, state_bytes=STATE_BYTES)
    kv_tokens = config.num_pages * config.page_size
    seqs = []
    for op in operations:
        if op[0] == "submit":
            _, n, seed, max_tokens, sampled = op
            params = {"max_tokens": max_tokens}
            if sampled:
                params.update(temperature=0.8, top_k=8, seed=seed)
            try:
                seqs.append(h.add(prompt(min(n, kv_tokens), seed), **params))
            except EngineOverloaded:
                pass
        else:
            h.cancel_or_step(op, seqs)
    h.run()
    for seq in seqs:
        assert seq.status is SeqStatus.FINISHED
        h.assert_correct(seq)  # the solo tokens (a prefix when cancelled), published once
        check_cycles(h, seq)
    check_routes(h, seqs)
    check_all_given_back(h)
    c = h.sched.counters
    if config.host_context_mib == 0:
        assert c.snapshot_restores == 0 and not h.ex.transfers
    if config.host_context_mib is None:  # every pause with anything computed is snapshotted
        assert c.replayed_tokens == 0


# -- deterministic scenarios --------------------------------------------------------------------


def pressured(h: SchedulerHarness, n: int = 4):
    """`n` requests that do not fit 12 pages of 4 tokens together (each fits alone)."""
    seqs = [h.add(prompt(9 + 3 * i, i + 1), max_tokens=14, ignore_eos=True) for i in range(n)]
    h.run()
    return seqs


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize(
    ("host_mib", "routes"),
    [(0, {"replay"}), (1, {"replay", "snapshot"}), (None, {"snapshot"})],
    ids=["disabled", "tight", "default"],
)
def test_the_budget_decides_the_route(hybrid, host_mib, routes):
    h = harness(
        hybrid, max_concurrency=4, kv_capacity=48, prefill_chunk=8, host_context_mib=host_mib
    )
    seqs = pressured(h)
    c = h.sched.counters
    assert c.preemptions > 0
    assert (c.snapshot_restores > 0) == ("snapshot" in routes)
    assert (c.replayed_tokens > 0) == ("replay" in routes)
    for s in seqs:
        h.assert_correct(s)
    check_routes(h, seqs)
    check_all_given_back(h)
    budget = h.sched.preemption.budget
    capacity = {0: 0, 1: MIB, None: 8192 * MIB + (8 * STATE_BYTES if hybrid else 0)}[host_mib]
    assert budget.capacity == capacity
    assert (budget.peak > 0) == ("snapshot" in routes)


def test_no_snapshot_capable_executor_means_replay_only():
    h = harness(snapshots=False, max_concurrency=4, kv_capacity=48, prefill_chunk=8)
    seqs = pressured(h)
    assert h.sched.counters.preemptions > 0 and h.sched.counters.snapshot_restores == 0
    assert h.sched.preemption.budget.capacity == 0 and not h.ex.transfers
    for s in seqs:
        h.assert_correct(s)


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_snapshot_lands_in_other_pages_and_only_the_computed_ones_travel(hybrid):
    h = harness(hybrid, max_concurrency=4, kv_capacity=48, prefill_chunk=8, prefix_reuse=False)
    seqs = pressured(h)
    snaps = [t for t in h.ex.transfers if t[0] == "snapshot"]
    restores = [t for t in h.ex.transfers if t[0] == "restore"]
    assert restores and len(snaps) == len(restores)
    # freed pages went to the requests that stayed: restores use pages other than the source
    assert any(set(r[1]) != set(s[1]) for s, r in zip(snaps, restores))
    if hybrid:  # the lane's state travels with the pages, into whatever lane is free then
        assert all(t[2] is not None for t in h.ex.transfers)
    for s in seqs:
        h.assert_correct(s)


def test_cancelling_a_paused_request_frees_its_snapshot():
    h = harness(max_concurrency=2, kv_capacity=40, prefill_chunk=8)
    a = h.add(prompt(8, 1), max_tokens=24, ignore_eos=True)
    b = h.add(prompt(8, 2), max_tokens=24, ignore_eos=True)
    while b.status is not SeqStatus.PAUSED:
        h.step()
    assert b.saved is not None and h.sched.preemption.budget.used == b.saved.nbytes > 0
    out = list(b.output_ids)
    h.sched.abort(b.seq_id, "cancelled", h.now)
    h.collect()
    assert h.sched.preemption.budget.used == 0 and b.saved is None
    h.run()
    assert h.published[b.seq_id] == out and b.finish_reason == "cancelled"
    h.assert_correct(a)
    h.assert_correct(b)
    check_all_given_back(h)


def test_the_host_budget_rejects_a_negative_size_and_defaults_to_eight_gib_plus_images():
    with pytest.raises(ConfigError, match="--host-context-mib"):
        EngineOptions.of(host_context_mib=-1)
    assert EngineOptions.of().host_context_bytes(1000) == 8192 * MIB + 8000
    assert EngineOptions.of(host_context_mib=3).host_context_bytes(1000) == 3 * MIB


# -- the engine ----------------------------------------------------------------------------------


class FailingRestore(FakeExecutor):
    """A FakeExecutor whose first restore raises (a failed host-to-device copy)."""

    failed = False

    def restore(self, snapshot, page_ids, state_slot):
        if not self.failed:
            self.failed = True
            raise RuntimeError("injected restore failure")
        super().restore(snapshot, page_ids, state_slot)


def engine(executor_cls=FakeExecutor, hybrid=False, **cfg) -> tuple[Engine, FakeExecutor]:
    config = EngineOptions.of(page_size=4, max_context=128, **cfg)
    ex = executor_cls(
        config.num_pages,
        4,
        32,
        is_hybrid=hybrid,
        num_state_slots=config.num_state_slots if hybrid else 0,
        page_bytes=PAGE_BYTES,
        state_bytes=STATE_BYTES,
    )
    return Engine(config, ex, Sampler(), (0,)), ex


def requests(n: int = 4) -> list[Request]:
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    return [Request(tuple(prompt(9 + 3 * i, i + 1)), params) for i in range(n)]


@pytest.mark.parametrize("hybrid", [False, True])
def test_engine_publishes_host_gauges_and_transfer_totals(hybrid):
    eng, ex = engine(
        hybrid=hybrid, max_concurrency=4, kv_capacity=48, prefill_chunk=8, host_context_mib=1
    )
    with eng:
        outs = [h.result(T) for h in [eng.submit(r) for r in requests()]]
        stats = eng.snapshot()
    h = harness(hybrid, max_concurrency=1, kv_capacity=128)
    for r, out in zip(requests(), outs):  # each equals the request run alone
        assert list(out.token_ids) == h.reference(
            h.add(list(r.prompt_token_ids), max_tokens=14, ignore_eos=True)
        )
    assert stats.snapshot_restores_total > 0 and stats.replay_restores_total > 0
    assert stats.host_context_capacity_bytes == MIB
    assert stats.host_context_used_bytes == stats.host_context_reserved_bytes == 0
    assert 0 < stats.host_context_peak_bytes <= MIB
    restored = sum(len(t[1]) for t in ex.transfers if t[0] == "restore")
    t = stats.context_transfer_bytes
    assert t[(KV, H2D)] == restored * PAGE_BYTES and t[(KV, D2H)] >= t[(KV, H2D)]
    assert t.get((STATE, H2D), 0) == (stats.snapshot_restores_total * STATE_BYTES if hybrid else 0)


@pytest.fixture
def quiet_engine_log():
    """The engine logs a failed step with its traceback; pytest keeps log records, and the
    traceback's frames would keep the failed restore's snapshot alive."""
    logger = logging.getLogger("ninfer.engine")
    logger.disabled = True
    yield
    logger.disabled = False


def test_a_failed_restore_fails_that_request_and_frees_its_bytes(quiet_engine_log):
    eng, ex = engine(FailingRestore, max_concurrency=4, kv_capacity=48, prefill_chunk=8)
    with eng:
        handles = [eng.submit(r) for r in requests()]
        results = []
        for h in handles:
            try:
                results.append(h.result(T))
            except EngineError:
                results.append(None)
        stats = eng.snapshot()
    assert ex.failed and stats.step_failures_total == 1
    assert any(r is None for r in results) and any(r is not None for r in results)
    assert stats.host_context_used_bytes == stats.host_context_reserved_bytes == 0
    assert stats.running == stats.paused == stats.waiting == 0
    assert_no_live_snapshots(ex)


def test_a_restore_leaves_the_residents_room_for_their_next_token():
    """A restore is admitted only when the residents can still take their next token each:
    otherwise planning their units pauses the youngest, the request just restored, before it
    ran a unit (its snapshot copied back and straight out again; 2 of these here before)."""
    h = harness(max_concurrency=8, kv_capacity=80, prefill_chunk=8)
    seqs = [h.add(prompt(10 + 2 * i, i + 1), max_tokens=24, ignore_eos=True) for i in range(8)]
    h.run()
    repaused = 0
    for s in seqs:
        h.assert_correct(s)
        events = [n for n in h.notices[s.seq_id] if isinstance(n, SchedulingEvent)]
        names = [e.boundary for e in events]
        repaused += sum(
            a == "restored" and b == "pause_started" for a, b in itertools.pairwise(names)
        )
    assert h.sched.counters.preemptions > 0
    assert repaused == 0, repaused

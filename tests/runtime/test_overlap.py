"""Decode steps scheduled ahead of the last commit (`Scheduler.schedule_ahead`), with the fake
model: the next step is planned and run, fed the sampled tokens on the device, before the host
has read them. Whatever runs ahead, every request must publish exactly what it produces alone;
a row whose request ends at the earlier commit is computed for nothing and dropped; the
scheduler refuses to plan ahead whenever the next step could differ from "every row again"."""

from __future__ import annotations

import pytest
from fake_executor import FakeExecutor, SchedulerHarness, reference_tokens

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.sequence import SeqStatus
from ninfer.runtime.step import FED

VOCAB, EOS, T = 32, (0,), 20


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 5 + i * 11) % 31 + 1 for i in range(n)]


def stopping_prompt(min_tokens: int = 3) -> list[int]:
    """A prompt whose greedy output ends with EOS after at least `min_tokens` tokens."""
    for seed in range(500):
        p = prompt(6, seed)
        ref = reference_tokens(
            p, SamplingParams(max_tokens=40, temperature=0.0), vocab=VOCAB, eos_ids=EOS,
            max_context=64,
        )  # fmt: skip
        if ref[-1] in EOS and len(ref) >= min_tokens:
            return p
    raise AssertionError("no prompt stops early")


def harness(hybrid: bool = False, **cfg) -> SchedulerHarness:
    cfg.setdefault("max_concurrency", 3)
    cfg.setdefault("page_size", 4)
    cfg.setdefault("kv_capacity", 96)
    cfg.setdefault("max_context", 64)
    return SchedulerHarness(EngineOptions.of(**cfg), is_hybrid=hybrid, eos_ids=EOS, overlap=True)


@pytest.mark.parametrize("hybrid", [False, True])
def test_decode_runs_ahead_and_reproduces_solo_runs(hybrid):
    h = harness(hybrid)
    seqs = [
        h.add(prompt(5, 1), max_tokens=20, ignore_eos=True),
        h.add(prompt(7, 2), max_tokens=13, temperature=0.8, top_k=8, seed=3, ignore_eos=True),
        h.add(stopping_prompt(), max_tokens=30),
    ]
    h.run()
    for s in seqs:
        h.assert_correct(s)
    fed = [p for p in h.plans if p.batch.fed_rows]
    assert h.ahead_steps == len(fed) > 5
    assert all(c.token_ids == (FED,) for p in fed for c in p.batch.chunks)
    assert h.sched.counters.generation_tokens == sum(s.num_output for s in seqs)


def test_the_ahead_row_of_a_request_that_stopped_is_dropped():
    h = harness()
    seq = h.add(stopping_prompt(), max_tokens=30)
    h.run()
    h.assert_correct(seq)
    assert seq.finish_reason == "stop"
    eos_pos = seq.known - 1  # the step fed the EOS ran ahead, before the commit that stopped
    assert any(c.start_pos == eos_pos for p in h.plans if p.batch.fed_rows for c in p.batch.chunks)
    assert h.published[seq.seq_id] == seq.output_ids


def test_a_request_cancelled_while_a_step_runs_ahead_keeps_a_prefix():
    h = harness()
    a = h.add(prompt(5, 1), max_tokens=30, ignore_eos=True)
    b = h.add(prompt(6, 2), max_tokens=30, ignore_eos=True)
    for _ in range(6):
        h.step()
    assert h.inflight is not None
    h.sched.abort(a.seq_id, "cancelled", h.now)
    h.collect()
    h.run()
    assert a.finish_reason == "cancelled" and 0 < a.num_output < 30
    h.assert_correct(a)
    h.assert_correct(b)
    assert b.num_output == 30
    assert h.sched.pool.num_used == h.sched.pool.num_reclaimable


def _decoding(h: SchedulerHarness, *seqs, steps: int = 3):
    """Run without overlap until every seq is decoding; returns the next plan, launched."""
    h.overlap = False
    for _ in range(steps):
        h.step()
    assert all(s.decode_ready for s in seqs)
    plan = h.sched.schedule(h.now)
    return plan, h._launch(plan)[1]


def test_schedule_ahead_plans_every_row_again_fed_by_row():
    h = harness(max_concurrency=2)
    a, b = h.add(prompt(5, 1), max_tokens=9), h.add(prompt(3, 2), max_tokens=9)
    plan, _ = _decoding(h, a, b)
    ahead = h.sched.schedule_ahead(plan, h.now)
    assert ahead is not None and ahead.chunk_seqs == plan.chunk_seqs
    assert ahead.batch.fed_rows == (0, 1)
    for c, prev in zip(ahead.batch.chunks, plan.batch.chunks):
        assert c.start_pos == prev.start_pos + 1 and c.token_ids == (FED,)
        assert len(c.block_table) * 4 >= c.start_pos + 1  # covers the fed position


@pytest.mark.parametrize(
    "case", ["penalty", "thinking", "admission", "prefill", "length", "checkpoint"]
)
def test_schedule_ahead_refuses_when_the_next_step_may_differ(case):
    hybrid = case == "checkpoint"
    h = harness(hybrid, max_concurrency=2)
    extra = {
        "penalty": {"presence_penalty": 0.5},
        "thinking": {"thinking_budget": 50, "thinking_close_ids": (31,),
                     "thinking_suffix_ids": (30, 31)},
        "length": {"max_tokens": 4},
    }.get(case, {})  # fmt: skip
    extra.setdefault("max_tokens", 20)
    a = h.add(prompt(6, 1) if case != "checkpoint" else prompt(7, 1), ignore_eos=True, **extra)
    plan, _ = _decoding(h, a, steps={"length": 3, "checkpoint": 2}.get(case, 1))
    if case == "admission":  # a lane is free and a request waits for it
        h.add(prompt(4, 5), max_tokens=3)
    if case == "prefill":  # a resident that still computes its prompt
        h.add(prompt(4, 5), max_tokens=3)
        plan = h.sched.schedule(h.now)
        assert any(not s.decode_ready for s in plan.chunk_seqs)
    if case == "checkpoint":  # the commit completes a page: the lane's state is captured
        assert (plan.batch.chunks[0].start_pos + 1) % 4 == 0
    if case == "length":  # the commit ends the only row with 'length'
        assert a.num_output + 1 == a.max_tokens
    assert h.sched.schedule_ahead(plan, h.now) is None
    assert a.status is SeqStatus.RUNNING


@pytest.mark.parametrize("hybrid", [False, True])
def test_engine_output_is_the_same_with_and_without_overlap(hybrid):
    reqs = [
        Request(
            tuple(prompt(4 + i, i)),
            SamplingParams(max_tokens=6 + 3 * i, temperature=0.7 if i % 2 else 0.0, seed=i),
        )
        for i in range(6)
    ]
    runs = []
    for feeds in (False, True):
        config = EngineOptions.of(max_concurrency=3, page_size=4, kv_capacity=64, max_context=64)
        slots = config.num_state_slots if hybrid else 0
        ex = FakeExecutor(
            config.num_pages, config.page_size, VOCAB, is_hybrid=hybrid,
            num_state_slots=slots, feeds_tokens=feeds,
        )  # fmt: skip
        with Engine(config, ex, Sampler(), EOS) as eng:
            outs = [h.result(timeout=T) for h in [eng.submit(r) for r in reqs]]
        runs.append([(o.token_ids, o.finish_reason) for o in outs])
        fed = sum(1 for b in ex.batches if b.fed_rows)
        assert (fed > 0) == feeds
    assert runs[0] == runs[1]

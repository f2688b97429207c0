"""Admission and prompt-progress events: the scheduler publishes them in order, and the engine's
request handle delivers them without merging them into token events."""

from __future__ import annotations

import time

import pytest
from fake_executor import FakeExecutor, SchedulerHarness, check_cycles, prompt, reference_tokens

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import (
    AdmittedEvent,
    FinishEvent,
    PromptProgressEvent,
    QueueTimeout,
    Request,
    SamplingParams,
    SchedulingEvent,
    TokensEvent,
)
from ninfer.runtime.sequence import SeqStatus

VOCAB, EOS, T = 32, (0,), 20


def harness(hybrid: bool = False, **cfg) -> SchedulerHarness:
    cfg.setdefault("page_size", 4)
    cfg.setdefault("max_context", 256)
    return SchedulerHarness(EngineOptions.of(**cfg), is_hybrid=hybrid, eos_ids=EOS)


def check_notices(h: SchedulerHarness, seq) -> list[int]:
    """The contract every admitted request's notices meet; returns the processed counts."""
    notices = [n for n in h.notices[seq.seq_id] if not isinstance(n, SchedulingEvent)]
    check_cycles(h, seq)
    admitted, progress = notices[0], notices[1:]
    assert admitted == AdmittedEvent(seq.num_prompt, seq.cached_tokens, seq.reuse_path)
    assert progress and all(isinstance(p, PromptProgressEvent) for p in progress)
    assert {(p.total, p.cache) for p in progress} == {(seq.num_prompt, seq.cached_tokens)}
    done = [p.processed for p in progress]
    assert seq.cached_tokens < done[0] and done == sorted(set(done)) and done[-1] == seq.num_prompt
    assert [p.elapsed_s for p in progress] == sorted(p.elapsed_s for p in progress)
    return done


def chunk_ends(h: SchedulerHarness, seq) -> list[int]:
    """Where each prompt chunk the executor ran for `seq` ended."""
    chunks = [c for p in h.plans for c in p.batch.chunks if c.seq_id == seq.seq_id]
    return [c.start_pos + len(c.token_ids) for c in chunks if c.start_pos < seq.num_prompt]


@pytest.mark.parametrize("hybrid", [False, True])
def test_admission_then_one_progress_event_per_committed_prefill_chunk(hybrid):
    h = harness(hybrid, prefill_chunk=6)
    seq = h.add(prompt(21), max_tokens=3, ignore_eos=True)
    h.run()
    done = check_notices(h, seq)
    assert done == chunk_ends(h, seq)
    assert h.notices[seq.seq_id][0] == AdmittedEvent(21, 0, "root")
    h.assert_correct(seq)  # notices never followed the first token (the harness checks)


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_prefix_hit_starts_progress_past_the_reused_tokens(hybrid):
    h = harness(hybrid, prefill_chunk=6)
    first = h.add(prompt(21), max_tokens=2, ignore_eos=True, checkpoint_positions=(16,))
    h.run()
    again = h.add(prompt(21) + prompt(9, 5), max_tokens=2, ignore_eos=True)
    h.run()
    check_notices(h, first)
    done = check_notices(h, again)
    cached = again.cached_tokens
    assert cached in (16, 20) and again.reuse_path == "checkpoint"  # marked or full-page end
    assert h.notices[again.seq_id][0] == AdmittedEvent(30, cached, "checkpoint")
    assert done == chunk_ends(h, again) and done[0] == cached + 6  # prefill from the reuse point


@pytest.mark.parametrize("route", ["replay", "snapshot"])
@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("hybrid", [False, True])
def test_restore_after_a_pause_in_the_prefill_publishes_no_progress(hybrid, reuse, route):
    # 10 pages of 4 tokens: `a` decodes into the pages `b` prefills into, so `b` is paused
    # part-way through its prompt and later rebuilt (by replay, or from a host snapshot).
    host = {"host_context_mib": 0} if route == "replay" else {}
    h = harness(
        hybrid, max_concurrency=2, kv_capacity=40, prefill_chunk=4, prefix_reuse=reuse, **host
    )
    a = h.add(prompt(24, 1), max_tokens=10, ignore_eos=True)
    b = h.add(prompt(20, 2), max_tokens=4, ignore_eos=True)
    paused_in_prefill = False
    while h.sched.has_work():
        h.step()
        paused_in_prefill |= b.status is SeqStatus.PAUSED and b.num_output == 0
    assert paused_in_prefill and b.preemptions >= 1
    if route == "replay":
        assert b.replayed_tokens > 0 and b.replay_restores == b.preemptions
        # replay chunks are prefill-class units; no copies ran for it
        assert 1 <= b.replay_units < b.prefill_units and b.control_units == 0 and not b.transfers
    else:
        assert b.replayed_tokens == 0 and b.snapshot_restores == b.preemptions
        # one save and one restore per pause: control units, and its own bytes both ways
        assert b.replay_units == 0 and b.control_units == 2 * b.snapshot_restores
        out, back = b.transfers["main_kv.device_to_host"], b.transfers["main_kv.host_to_device"]
        assert out == back and out["bytes"] > 0 and out["operations"] == b.snapshot_restores
        assert h.sched.preemption.transfer_bytes[("main_kv", "device_to_host")] == out["bytes"]
    for s in (a, b):  # the first token comes from the prefill, each later one from a round
        assert s.decode_rounds <= s.num_output - 1 and s.prefill_units >= 1
        if s.preemptions == 0:
            assert s.decode_rounds == s.num_output - 1 and s.replay_units == 0
    assert check_notices(h, b) == [4, 8, 12, 16, 20]  # one admission, progress once per chunk
    assert [type(n) for n in h.notices[b.seq_id]].count(AdmittedEvent) == 1
    for s in (a, b):
        check_notices(h, s)
        h.assert_correct(s)


def make_engine(**cfg) -> Engine:
    config = EngineOptions.of(page_size=4, max_context=128, **cfg)
    return Engine(config, FakeExecutor(config.num_pages, 4, VOCAB), Sampler(), EOS)


def test_the_handle_keeps_events_apart_and_coalesces_unread_progress():
    req = Request(prompt(21), SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    with make_engine(prefill_chunk=4) as eng:
        h = eng.submit(req)
        out = h.result(timeout=T)  # everything is queued before it is read
        events = list(h)
    admitted, progress, tokens, fin = events
    assert admitted == AdmittedEvent(21, 0, "root")
    assert isinstance(progress, PromptProgressEvent)
    assert (progress.total, progress.cache, progress.processed) == (21, 0, 21)
    assert isinstance(tokens, TokensEvent) and isinstance(fin, FinishEvent)
    expected = reference_tokens(req.prompt_token_ids, req.sampling, vocab=VOCAB, eos_ids=EOS,
                                max_context=128)  # fmt: skip
    assert list(tokens.token_ids) == list(out.token_ids) == expected


def test_events_read_as_they_come_show_every_chunk():
    req = Request(prompt(21), SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    with make_engine(prefill_chunk=4) as eng:
        seen = list(eng.submit(req))  # read while the worker runs
    kinds = [type(e) for e in seen]
    assert kinds[0] is AdmittedEvent and kinds[-1] is FinishEvent
    first_token = kinds.index(TokensEvent)
    assert set(kinds[1:first_token]) == {PromptProgressEvent}
    assert PromptProgressEvent not in kinds[first_token:]
    done = [e.processed for e in seen[1:first_token]]
    assert done == sorted(set(done)) and done[-1] == 21 and set(done) <= {4, 8, 12, 16, 20, 21}


def test_a_request_that_is_never_admitted_sees_only_its_finish():
    with make_engine(max_concurrency=1, pending_timeout_ms=1) as eng:
        # the deadline is 1 ms after arrival: an arrival long past has expired already
        late = Request(prompt(4), SamplingParams(max_tokens=2), arrival_s=-10.0)
        events = list(eng.submit(late))
    assert len(events) == 1 and isinstance(events[0], FinishEvent)
    assert isinstance(events[0].error, QueueTimeout)


class _SlowExecutor(FakeExecutor):
    """A synchronous executor (no token feeding, as the CPU one): each run takes a while."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, feeds_tokens=False, **kwargs)
        self.ends: list[float] = []

    def run(self, batch, fed=None):
        time.sleep(0.15)
        out = super().run(batch, fed)
        self.ends.append(time.monotonic())
        return out


def test_a_synchronous_launch_does_not_hold_back_published_events():
    """With no step in flight the engine publishes before it launches: the admission reaches
    the stream before the first prefill chunk has run, and each token before the step after
    its own has run (a CPU executor runs a launch to its end)."""
    req = Request(prompt(6), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    config = EngineOptions.of(page_size=4, max_context=128)
    executor = _SlowExecutor(config.num_pages, 4, VOCAB)
    with Engine(config, executor, Sampler(), EOS) as eng:
        seen = [(e, time.monotonic()) for e in eng.submit(req)]
    ends = executor.ends
    assert len(ends) == 3  # the prefill and two decode steps
    admitted_at = next(t for e, t in seen if isinstance(e, AdmittedEvent))
    token_at = [t for e, t in seen if isinstance(e, TokensEvent) for _ in e.token_ids]
    assert len(token_at) == 3
    assert admitted_at < ends[0]
    assert token_at[0] < ends[1] and token_at[1] < ends[2]


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_prompt_only_request_commits_no_token(hybrid):
    """prompt_only (an HTTP max_tokens of 0): the prompt is prefilled and published for reuse,
    and the request finishes with 'length' without an output token."""
    config = EngineOptions.of(page_size=4, max_context=128, prefill_chunk=8)
    exe = FakeExecutor(config.num_pages, 4, VOCAB, is_hybrid=hybrid, num_state_slots=4)
    req = Request(prompt(21), SamplingParams(max_tokens=1), prompt_only=True)
    with Engine(config, exe, Sampler(), EOS) as eng:
        events = list(eng.submit(req))
        longer = Request(prompt(21) + prompt(6, 3), SamplingParams(max_tokens=2, ignore_eos=True))
        second = list(eng.submit(longer))
        stats = eng.snapshot()
    assert not any(isinstance(e, TokensEvent) for e in events)
    fin = events[-1]
    assert isinstance(fin, FinishEvent) and fin.reason == "length" and fin.token_ids == ()
    assert fin.usage.completion_tokens == 0 and fin.timings.ttft_s is None
    assert [e.processed for e in events if isinstance(e, PromptProgressEvent)][-1] == 21
    # what it prefilled is reused: a request extending its prompt starts past it
    assert second[0].cached_tokens >= 20
    assert stats.generation_tokens_total == 2

"""The engine loop on its worker thread, with the fake executor and the real sampler."""

from __future__ import annotations

import asyncio
import threading

import pytest
from fake_executor import FakeExecutor, reference_tokens

from ninfer.errors import ConfigError
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import (
    AdmittedEvent,
    EngineError,
    EngineOverloaded,
    FinishEvent,
    PromptProgressEvent,
    QueueTimeout,
    Request,
    SamplingParams,
    TokensEvent,
)

VOCAB, EOS = 32, (0,)
T = 20  # seconds: generous bound for any wait in these tests


class GatedExecutor(FakeExecutor):
    """A FakeExecutor whose steps wait for `gate` to be set (to hold requests in flight)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def run(self, batch, fed=None):
        self.entered.set()
        assert self.gate.wait(T)
        return super().run(batch, fed)


def make_engine(executor_cls=FakeExecutor, hybrid=False, fail_steps=(), **cfg) -> Engine:
    cfg.setdefault("page_size", 4)
    cfg.setdefault("max_context", 128)
    config = EngineOptions.of(**cfg)
    slots = config.num_state_slots if hybrid else 0
    ex = executor_cls(
        config.num_pages,
        config.page_size,
        VOCAB,
        is_hybrid=hybrid,
        num_state_slots=slots,
        fail_steps=fail_steps,
    )
    return Engine(config, ex, Sampler(), EOS)


def ref(req: Request, max_context: int = 128) -> list[int]:
    return reference_tokens(
        req.prompt_token_ids, req.sampling, vocab=VOCAB, eos_ids=EOS, max_context=max_context
    )


def prompt(n: int, seed: int) -> tuple[int, ...]:
    return tuple((seed * 5 + i * 11) % 31 + 1 for i in range(n))


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_concurrent_requests_under_pressure_match_solo_runs(hybrid, route):
    shared = prompt(12, 9)
    reqs = [
        Request(
            shared[: 4 * (i % 4)] + prompt(5 + i, i),
            SamplingParams(max_tokens=10 + i, temperature=0.8 if i % 2 else 0.0, seed=i, top_k=10),
            checkpoint_positions=(4 * (i % 4),),
        )
        for i in range(8)
    ]
    host = {"host_context_mib": 0} if route == "replay" else {}
    with make_engine(
        hybrid=hybrid, max_concurrency=3, kv_capacity=48, prefill_chunk=6, **host
    ) as eng:
        handles = [eng.submit(r) for r in reqs]
        outs = [h.result(timeout=T) for h in handles]
        stats = eng.snapshot()
    for r, out in zip(reqs, outs):
        assert list(out.token_ids) == ref(r)
        assert out.usage.prompt_tokens == len(r.prompt_token_ids)
        assert out.usage.completion_tokens == len(out.token_ids)
        assert out.finish_reason == ("stop" if out.token_ids[-1] == 0 else "length")
        assert out.timings.total_s >= (out.timings.ttft_s or 0) >= 0
    assert stats.preemptions_total > 0
    assert stats.host_context_used_bytes == stats.host_context_reserved_bytes == 0
    if route == "replay":
        assert stats.replay_restores_total == stats.preemptions_total
        assert stats.replayed_tokens_total > 0 and stats.host_context_capacity_bytes == 0
        assert stats.snapshot_restores_total == 0 and not stats.context_transfer_bytes
    else:  # every pause fits the default budget; nothing is recomputed
        assert stats.snapshot_restores_total > 0
        assert (
            stats.snapshot_restores_total + stats.replay_restores_total == stats.preemptions_total
        )
        assert stats.host_context_capacity_bytes == 8192 * 2**20 + (8 * 64 if hybrid else 0)
        assert stats.host_context_peak_bytes > 0
        t = stats.context_transfer_bytes
        assert t[("main_kv", "device_to_host")] == t[("main_kv", "host_to_device")] > 0
        assert (("state", "device_to_host") in t) == hybrid
    assert stats.generation_tokens_total == sum(len(o.token_ids) for o in outs)
    assert stats.decode_tokens_total == stats.generation_tokens_total - len(outs)
    assert stats.prompt_tokens_total == sum(len(r.prompt_token_ids) for r in reqs)
    assert stats.prompt_tokens_cached_total == sum(o.usage.cached_tokens for o in outs)
    assert stats.replayed_tokens_total == sum(o.usage.replayed_tokens for o in outs)
    assert sum(stats.requests_by_outcome.values()) == 8
    assert stats.running == stats.waiting == stats.paused == 0
    assert stats.kv_pages_capacity == 12


def test_async_stream_publishes_each_token_once_then_finishes():
    async def main():
        with make_engine(max_concurrency=2) as eng:
            req = Request(
                prompt(6, 1), SamplingParams(max_tokens=12, ignore_eos=True, temperature=0)
            )
            events = [e async for e in eng.submit(req)]
        return req, events

    req, events = asyncio.run(main())
    assert isinstance(events[0], AdmittedEvent) and isinstance(events[-1], FinishEvent)
    assert isinstance(events[1], PromptProgressEvent) and events[1].processed == 6
    assert all(isinstance(e, TokensEvent) for e in events[2:-1])
    streamed = [t for e in events[2:-1] for t in e.token_ids]
    assert streamed == list(events[-1].token_ids) == ref(req)
    assert events[-1].reason == "length"


def test_sync_iteration_and_prefix_reuse_usage():
    with make_engine() as eng:
        first = Request(prompt(21, 3), SamplingParams(max_tokens=3, temperature=0))
        eng.submit(first).result(timeout=T)
        again = eng.submit(first)
        events = list(again)
    fin = events[-1]
    assert fin.usage.cached_tokens == 20 and fin.usage.reuse_path == "checkpoint"
    assert fin.usage.prefill_tokens == 1
    assert events[0] == AdmittedEvent(21, 20, "checkpoint")
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.token_ids]
    assert tokens == list(fin.token_ids) == ref(first)


def test_cancel_a_running_and_a_waiting_request():
    eng = make_engine(GatedExecutor, max_concurrency=1)
    params = SamplingParams(max_tokens=100, ignore_eos=True, seed=11)
    long = eng.submit(Request(prompt(4, 1), params))
    queued = eng.submit(Request(prompt(4, 2)))
    assert eng._executor.entered.wait(T)
    eng.cancel(queued)
    eng._executor.gate.set()
    stream = iter(long)
    assert isinstance(next(stream), AdmittedEvent)
    first = next(e for e in stream if not isinstance(e, PromptProgressEvent))
    assert isinstance(first, TokensEvent)
    long.cancel()
    out_long = long.result(timeout=T)
    out_queued = queued.result(timeout=T)
    assert out_long.finish_reason == "cancelled" and 1 <= len(out_long.token_ids) < 100
    full = ref(Request(prompt(4, 1), params))
    assert list(out_long.token_ids) == full[: len(out_long.token_ids)]
    assert out_queued.finish_reason == "cancelled" and out_queued.token_ids == ()
    assert out_queued.timings.queue_s is None
    eng.close()
    assert eng.snapshot().requests_by_outcome == {"cancelled": 2}


def test_finish_for_a_caller_matched_stop_keeps_accepted_tokens():
    eng = make_engine(GatedExecutor, max_concurrency=1)
    h = eng.submit(Request(prompt(4, 1), SamplingParams(max_tokens=100, ignore_eos=True)))
    eng._executor.gate.set()
    got = []
    for e in h:
        if isinstance(e, TokensEvent):
            got += e.token_ids
            if len(got) >= 3:
                eng.finish(h, "stop", keep_tokens=2)
        else:
            fin = e
    eng.close()
    assert fin.reason == "stop" and len(fin.token_ids) == 2 and fin.usage.completion_tokens == 2
    assert list(fin.token_ids) == got[:2]


def test_overload_is_refused_at_submit_and_waiting_requests_time_out():
    eng = make_engine(
        GatedExecutor, max_concurrency=1, max_pending_requests=1, pending_timeout_ms=200
    )
    running = eng.submit(Request(prompt(4, 1), SamplingParams(max_tokens=3)))
    waiting = eng.submit(Request(prompt(4, 2), SamplingParams(max_tokens=3)))
    assert eng._executor.entered.wait(T)
    with pytest.raises(EngineOverloaded):
        eng.submit(Request(prompt(4, 3)))
    stats = eng.snapshot()
    assert (stats.running, stats.waiting) == (1, 1) and stats.kv_pages_used >= 1
    threading.Timer(0.5, eng._executor.gate.set).start()  # hold the lane past the deadline
    with pytest.raises(QueueTimeout, match="pending-timeout-ms"):
        waiting.result(timeout=T)
    assert running.result(timeout=T).finish_reason in ("stop", "length")
    eng.close()
    assert eng.snapshot().requests_by_outcome.get("error") == 1


def test_a_failed_step_fails_its_requests_and_the_engine_keeps_serving():
    with make_engine(fail_steps=(1,)) as eng:
        bad = eng.submit(Request(prompt(4, 1), SamplingParams(max_tokens=5, ignore_eos=True)))
        with pytest.raises(EngineError, match="injected failure"):
            bad.result(timeout=T)
        req = Request(prompt(4, 2), SamplingParams(max_tokens=5, temperature=0))
        assert list(eng.submit(req).result(timeout=T).token_ids) == ref(req)
        assert eng.snapshot().step_failures_total == 1
        assert eng.snapshot().ready


def test_close_cancels_outstanding_requests_and_refuses_new_ones():
    eng = make_engine(GatedExecutor, max_concurrency=1)
    h = eng.submit(Request(prompt(4, 1), SamplingParams(max_tokens=50, ignore_eos=True)))
    assert eng._executor.entered.wait(T)
    threading.Timer(0.2, eng._executor.gate.set).start()
    eng.close()
    assert h.result(timeout=T).finish_reason == "cancelled"
    assert not eng.snapshot().ready
    with pytest.raises(EngineError):
        eng.submit(Request(prompt(4, 1)))


def test_a_hybrid_executor_without_a_slot_per_lane_is_a_config_error():
    ex = FakeExecutor(8, 4, is_hybrid=True, num_state_slots=1)
    with pytest.raises(ConfigError, match="one per lane"):
        Engine(EngineOptions.of(max_concurrency=2, page_size=4), ex, Sampler(), EOS)

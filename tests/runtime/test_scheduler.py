"""Scheduler behaviour with a fake executor: chunking, compact decode batches, admission,
pressure pauses with replay, prefix reuse, stop conditions. Every step also runs the
scheduler's and the fake's invariant checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fake_executor import SchedulerHarness, prompt, reference_tokens

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.request import (
    EngineOverloaded,
    QueueTimeout,
    Request,
    RequestError,
    SamplingParams,
)
from ninfer.runtime.sequence import SeqStatus


def harness(**cfg) -> SchedulerHarness:
    hybrid = cfg.pop("hybrid", False)
    eos = cfg.pop("eos", (0,))
    cfg.setdefault("page_size", 4)
    cfg.setdefault("max_context", 256)
    return SchedulerHarness(EngineOptions.of(**cfg), is_hybrid=hybrid, eos_ids=eos)


def test_pure_python_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import ninfer.runtime.scheduler, ninfer.runtime.pages, ninfer.runtime.prefix_cache\n"
        "import ninfer.runtime.request, ninfer.runtime.config, ninfer.runtime.sequence\n"
        "import ninfer.runtime.executor_api, ninfer.runtime.step, ninfer.runtime.retention\n"
        "import ninfer.runtime.residency, ninfer.runtime.preemption\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prefill_is_chunked_and_only_the_last_chunk_returns_logits():
    h = harness(prefill_chunk=16)
    seq = h.add(prompt(40), max_tokens=3, ignore_eos=True)
    h.run()
    chunks = [p.batch.chunks[0] for p in h.plans]
    assert [len(c.token_ids) for c in chunks] == [16, 16, 8, 1, 1]
    assert [c.start_pos for c in chunks] == [0, 16, 32, 40, 41]
    assert [c.want_logits for c in chunks] == [False, False, True, True, True]
    assert all(len(c.block_table) * 4 >= c.start_pos + len(c.token_ids) for c in chunks)
    assert seq.finish_reason == "length" and seq.prefill_tokens == 40
    h.assert_correct(seq)


def test_decode_rows_form_one_compact_batch():
    h = harness(max_concurrency=3, prefill_chunk=64)
    a = h.add(prompt(5, 1), max_tokens=2, ignore_eos=True)
    b = h.add(prompt(6, 2), max_tokens=6, ignore_eos=True)
    c = h.add(prompt(7, 3), max_tokens=6, ignore_eos=True)
    h.step()  # all three prompts fit in the prefill budget
    assert [len(ch.token_ids) for ch in h.plans[0].batch.chunks] == [5, 6, 7]
    h.step()
    assert [ch.seq_id for ch in h.plans[1].batch.chunks] == [a.seq_id, b.seq_id, c.seq_id]
    assert all(len(ch.token_ids) == 1 for ch in h.plans[1].batch.chunks)
    assert a.status is SeqStatus.FINISHED
    h.step()  # the finished row is gone, no empty row
    assert [ch.seq_id for ch in h.plans[2].batch.chunks] == [b.seq_id, c.seq_id]
    h.run()
    for s in (a, b, c):
        h.assert_correct(s)


def test_a_request_joins_decode_only_after_its_prefill_and_budget_is_shared():
    h = harness(max_concurrency=2, prefill_chunk=8)
    a = h.add(prompt(3, 1), max_tokens=20, ignore_eos=True)
    h.step()
    b = h.add(prompt(20, 2), max_tokens=2, ignore_eos=True)
    h.step()  # a decodes while b's first prefill chunk runs in the same batch
    rows = h.plans[-1].batch.chunks
    assert [(ch.seq_id, len(ch.token_ids), ch.want_logits) for ch in rows] == [
        (a.seq_id, 1, True),
        (b.seq_id, 8, False),
    ]
    h.step()
    h.step()
    rows = h.plans[-1].batch.chunks
    assert [(ch.seq_id, len(ch.token_ids)) for ch in rows] == [(a.seq_id, 1), (b.seq_id, 4)]
    h.step()
    assert [ch.seq_id for ch in h.plans[-1].batch.chunks] == [a.seq_id, b.seq_id]
    assert all(len(ch.token_ids) == 1 for ch in h.plans[-1].batch.chunks)
    h.run()
    h.assert_correct(a)
    h.assert_correct(b)


def test_the_prefill_budget_is_shared_by_prompts_in_arrival_order():
    h = harness(max_concurrency=3, prefill_chunk=16)
    a = h.add(prompt(10, 1), max_tokens=2, ignore_eos=True)
    b = h.add(prompt(10, 2), max_tokens=2, ignore_eos=True)
    c = h.add(prompt(10, 3), max_tokens=2, ignore_eos=True)
    h.step()
    assert [(ch.seq_id, len(ch.token_ids)) for ch in h.plans[0].batch.chunks] == [
        (a.seq_id, 10),
        (b.seq_id, 6),
    ]
    h.step()  # a decodes; b finishes its prompt, c takes the rest of the budget
    assert [(ch.seq_id, len(ch.token_ids)) for ch in h.plans[1].batch.chunks] == [
        (a.seq_id, 1),
        (b.seq_id, 4),
        (c.seq_id, 10),
    ]
    h.run()
    for s in (a, b, c):
        h.assert_correct(s)


def test_lanes_bound_residency_and_admission_is_fifo():
    h = harness(max_concurrency=2, max_pending_requests=4)
    seqs = [h.add(prompt(4, i), max_tokens=3 + i, ignore_eos=True) for i in range(4)]
    h.step()
    assert [s.status for s in seqs] == [SeqStatus.RUNNING] * 2 + [SeqStatus.WAITING] * 2
    h.run()
    admitted = sorted(seqs, key=lambda s: s.admitted_s or 0)
    assert [s.seq_id for s in admitted] == [0, 1, 2, 3]
    for s in seqs:
        h.assert_correct(s)


def test_too_many_outstanding_requests_are_refused():
    h = harness(max_concurrency=1, max_pending_requests=1)
    h.add(prompt(4))
    h.add(prompt(4))
    with pytest.raises(EngineOverloaded, match="retry later"):
        h.add(prompt(4))


def test_unservable_prompts_are_rejected():
    h = harness(max_context=16, kv_capacity=12)
    with pytest.raises(RequestError, match="context limit is 16"):
        h.add(prompt(16))
    with pytest.raises(RequestError, match="KV pool holds 12"):
        h.add(prompt(13))
    with pytest.raises(RequestError, match="empty"):
        Request(())


def test_a_waiting_request_times_out_but_a_resident_one_does_not():
    h = harness(max_concurrency=1, pending_timeout_ms=1000)
    a = h.add(prompt(4), max_tokens=50, ignore_eos=True)
    b = h.add(prompt(4, 2))
    h.step()
    h.now = 1.5
    h.step()
    assert b.finish_reason == "error" and isinstance(b.error, QueueTimeout)
    assert a.status is SeqStatus.RUNNING
    assert h.published[b.seq_id] == []
    h.run()
    h.assert_correct(a)


def test_the_pending_timeout_counts_from_the_start_of_preparation():
    # both arrive at 1.0 behind a resident request; c began preparing 0.8 s earlier, so its
    # 1 s deadline passes at 1.2, b's at 2.0
    h = harness(max_concurrency=1, pending_timeout_ms=1000)
    a = h.add(prompt(4), max_tokens=50, ignore_eos=True)
    h.step()
    h.now = 1.0
    b = h.sched.add(Request(tuple(prompt(4, 2)), arrival_s=1.0), h.now)
    c = h.sched.add(Request(tuple(prompt(4, 3)), arrival_s=1.0, prepared_from_s=0.2), h.now)
    for s in (b, c):
        h.published[s.seq_id], h.notices[s.seq_id] = [], []
    h.now = 1.5
    h.step()
    assert c.finish_reason == "error" and isinstance(c.error, QueueTimeout)
    assert b.status is SeqStatus.WAITING and a.status is SeqStatus.RUNNING


def test_head_of_line_bypass_is_bounded():
    # 8 pages of 4 tokens. A long-running request holds pages so the big head cannot fit.
    h = harness(max_concurrency=3, kv_capacity=32, admission_bypass=2, prefix_reuse=False)
    a = h.add(prompt(12, 1), max_tokens=40, ignore_eos=True)  # 3+ pages, grows
    h.step()
    big = h.add(prompt(24, 2), max_tokens=1)  # 6 pages: does not fit beside a
    small = [h.add(prompt(2, 3 + i), max_tokens=1, ignore_eos=True) for i in range(3)]
    h.step()
    assert big.status is SeqStatus.WAITING
    assert small[0].status is not SeqStatus.WAITING and small[1].status is not SeqStatus.WAITING
    h.step()
    assert big.bypassed == 2
    assert small[2].status is SeqStatus.WAITING  # may not pass the head a third time
    h.run()
    assert small[2].admitted_s is not None and big.admitted_s is not None
    assert big.seq_id < small[2].seq_id
    for s in [a, big, *small]:
        h.assert_correct(s)


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_pressure_pauses_the_younger_request_and_restoring_reproduces_it(hybrid, route):
    # 10 pages of 4 tokens; two requests that each end near 28 tokens cannot both stay.
    # host_context_mib 0 leaves replay as the only route; the default budget holds snapshots.
    host = {"host_context_mib": 0} if route == "replay" else {}
    h = harness(max_concurrency=2, kv_capacity=40, prefill_chunk=8, hybrid=hybrid, **host)
    a = h.add(prompt(8, 1), max_tokens=20, ignore_eos=True)
    b = h.add(prompt(8, 2), max_tokens=20, ignore_eos=True)
    h.run()
    assert a.preemptions == 0  # the oldest resident keeps its progress
    assert b.preemptions >= 1
    c = h.sched.counters
    assert c.preemptions == b.preemptions
    if route == "replay":
        assert b.replayed_tokens > 0 and c.replay_restores == b.preemptions
        assert c.snapshot_restores == 0 and not h.ex.transfers
    else:  # copied back: nothing recomputed
        assert b.replayed_tokens == 0 and c.snapshot_restores == b.preemptions
        assert c.replay_restores == 0
        assert [t[0] for t in h.ex.transfers] == ["snapshot", "restore"] * b.preemptions
    assert c.replayed_tokens == b.replayed_tokens
    assert c.generation_tokens == 40  # restoring produced no extra outputs
    assert h.sched.preemption.budget.used == 0 and not h.ex.live_snapshots
    for s in (a, b):
        h.assert_correct(s)  # also: tokens were published exactly once, in order


def test_a_request_alone_that_outgrows_the_pool_finishes_with_length():
    h = harness(max_concurrency=1, kv_capacity=16, max_context=64)
    a = h.add(prompt(10), max_tokens=50, ignore_eos=True)
    h.run()
    assert a.finish_reason == "length" and a.known == 17
    h.assert_correct(a)


def test_stop_conditions():
    free_run = reference_tokens(
        prompt(3, 4), SamplingParams(temperature=0.0), vocab=32, eos_ids=(), max_context=9
    )
    eos = free_run[3]  # make the model's 4th (or an earlier equal) token the EOS id
    h = harness(max_concurrency=4, max_context=20, eos=(eos,))
    by_eos = h.add(prompt(3, 4))
    capped = h.add(prompt(3, 5), max_tokens=4, ignore_eos=True)
    ctx = h.add(prompt(10, 6), ignore_eos=True)
    h.run()
    assert by_eos.finish_reason == "stop"
    assert by_eos.output_ids == free_run[: free_run.index(eos) + 1]
    assert capped.finish_reason == "length" and capped.num_output == 4
    assert ctx.finish_reason == "length" and ctx.known == 20
    for s in (by_eos, capped, ctx):
        h.assert_correct(s)


def test_abort_keeps_the_accepted_tokens_only():
    h = harness(max_concurrency=1)
    a = h.add(prompt(4), max_tokens=30, ignore_eos=True)
    for _ in range(6):
        h.step()
    assert a.num_output == 6  # the prefill step samples the first
    assert h.sched.abort(a.seq_id, "stop", h.now, keep_tokens=3)
    h.collect()
    assert a.finish_reason == "stop" and a.num_output == 3
    assert not h.sched.abort(a.seq_id, "cancelled", h.now)  # already finished
    assert h.sched.pool.num_used == h.sched.pool.num_reclaimable  # only cached pages remain


def test_prefix_reuse_of_full_pages_for_attention_models():
    h = harness(max_concurrency=1)
    p = prompt(30)
    first = h.add(p, max_tokens=5, ignore_eos=True)
    h.run()
    again = h.add(p, max_tokens=5, ignore_eos=True)
    longer = h.add(p + first.output_ids + [3, 4, 5], max_tokens=5, ignore_eos=True)
    h.run()
    assert first.reuse_path == "root" and first.cached_tokens == 0
    assert again.reuse_path == "checkpoint" and again.cached_tokens == 28  # 7 full pages
    assert again.prefill_tokens == 2
    assert longer.cached_tokens == 32  # the first request's output pages are reused too
    for s in (first, again, longer):
        h.assert_correct(s)
    c = h.sched.counters
    assert c.prompt_tokens == 30 + 30 + 38 and c.cached_tokens == 28 + 32


def test_no_prefix_reuse_means_no_retained_pages():
    h = harness(max_concurrency=1, prefix_reuse=False)
    p = prompt(30)
    h.add(p, max_tokens=3)
    h.run()
    again = h.add(p, max_tokens=3)
    h.run()
    assert again.cached_tokens == 0 and again.reuse_path == "root"
    assert h.sched.pool.num_used == 0


def test_hybrid_reuse_needs_a_checkpoint():
    h = harness(max_concurrency=1, hybrid=True, device_state_slots=2)
    system = prompt(13, 1)  # a shared prefix; the caller marks its end (position 13 -> 12)
    a = h.add(system + prompt(9, 2), max_tokens=3, ignore_eos=True, checkpoint_positions=(13,))
    h.run()
    # the marked boundary forced a chunk split at 12, the prompt's last full page at 20
    starts = [p.batch.chunks[0].start_pos for p in h.plans]
    assert starts[:3] == [0, 12, 20]
    b = h.add(system + prompt(5, 3), max_tokens=3, ignore_eos=True)
    c = h.add(prompt(20, 4), max_tokens=3, ignore_eos=True)  # unrelated: from the root
    h.run()
    assert b.cached_tokens == 12 and b.reuse_path == "checkpoint"
    assert c.cached_tokens == 0 and c.reuse_path == "root"
    # the restore copied the checkpoint slot into the lane before b's first chunk
    first_b = next(p for p in h.plans if p.batch.chunks[0].seq_id == b.seq_id)
    assert first_b.batch.chunks[0].start_pos == 12
    assert any(cp.dst_slot == 0 and cp.src_slot >= 1 for cp in first_b.batch.state_copies)
    for s in (a, b, c):
        h.assert_correct(s)  # the fake verified the restored state digest


def test_hybrid_continuation_reuses_the_finished_endpoint():
    h = harness(max_concurrency=1, hybrid=True)
    p = prompt(9)
    first = h.add(p, max_tokens=12, ignore_eos=True, session_key="chat")
    h.run()
    # known = 21; the rolling checkpoint sits at the last page boundary reached: 20
    turn2 = h.add(p + first.output_ids + [7, 7, 7], max_tokens=4, ignore_eos=True)
    h.run()
    assert turn2.cached_tokens == 20 and turn2.reuse_path == "checkpoint"
    h.assert_correct(first)
    h.assert_correct(turn2)


@pytest.mark.parametrize("good_steps", [1, 2])
def test_step_failure_fails_its_requests_and_forgets_unwritten_checkpoints(good_steps):
    h = harness(max_concurrency=2, hybrid=True)
    a = h.add(prompt(8, 1), max_tokens=10, ignore_eos=True, checkpoint_positions=(8,))
    for _ in range(good_steps):
        h.step()
    plan = h.sched.schedule(h.now)  # step 2 carries the capture copy of position 8
    assert bool(plan.batch.state_copies) == (good_steps == 1)
    h.sched.fail_step(plan, h.now, RuntimeError("boom"))
    h.collect()
    assert a.finish_reason == "error"
    survived = good_steps == 2
    assert h.sched.cache.num_checkpoints == (1 if survived else 0)
    h.sched.check()
    b = h.add(prompt(8, 1) + [5], max_tokens=10, ignore_eos=True)
    h.run()
    assert b.cached_tokens == (8 if survived else 0)
    h.assert_correct(b)


def test_engine_config_defaults_follow_the_serve_flags():
    c = EngineOptions.of()
    assert (c.max_concurrency, c.max_pending_requests, c.pending_timeout_ms) == (1, 16, 30000)
    assert (c.prefill_chunk, c.max_context, c.default_max_tokens) == (1024, 8192, 8192)
    assert c.kv_tokens == 8192 and c.num_pages == 512 and c.prefix_reuse
    assert c.num_state_slots == 2  # one lane + device_state_slots defaulting to the lanes
    c = EngineOptions.of(max_concurrency=4, device_state_slots=0, kv_capacity=100, page_size=16)
    assert c.num_state_slots == 4 and c.num_pages == 7


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_concurrency": 9}, r"--max-concurrency must be in 1..8, got 9"),
        ({"max_concurrency": 0}, "must be in 1..8"),
        ({"prefill_chunk": 0}, "--prefill-chunk"),
        ({"kv_capacity": 8, "page_size": 16}, "--kv-capacity"),
        ({"max_pending_requests": -1}, "--max-pending-requests"),
        ({"pending_timeout_ms": 1.5}, "must be an integer"),
        ({"device_state_slots": -2}, "--device-state-slots"),
        ({"prefix_reuse": "yes"}, "prefix_reuse must be true or false"),
    ],
)
def test_engine_config_rejects_impossible_values(options, message):
    from ninfer.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        EngineOptions.of(**options)

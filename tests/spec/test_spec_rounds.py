"""The scheduler's side of a round, without a model: a verify chunk is the decode token plus the
drafts with one logits row each, committing it advances exactly the accepted prefix (stopping
where a stop condition ends the request), and the pages that held only rejected positions go
back to the pool."""

from __future__ import annotations

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.scheduler import Scheduler

PAGE = 4
EOS = 99


def _decode_ready(max_tokens: int = 50, k: int = 6, prefix_reuse: bool = True) -> tuple:
    config = EngineOptions.of(
        max_concurrency=2, max_context=256, kv_capacity=64, page_size=PAGE,
        spec="draft", draft_model="unused.ninfer", draft_tokens=k, prefix_reuse=prefix_reuse,
    )  # fmt: skip
    sched = Scheduler(config, num_pages=16, page_size=PAGE, eos_ids={EOS})
    seq = sched.add(Request((1, 2, 3, 4, 5), SamplingParams(max_tokens=max_tokens)), 0.0)
    plan = sched.schedule(0.0)
    sched.commit(plan, [10], 0.0)  # prefill: first token 10, decode-ready at position 5
    assert seq.decode_ready and seq.computed == 5 and len(seq.pages) == 2
    return sched, seq


def test_a_verify_chunk_commits_the_accepted_prefix_and_frees_rejected_pages():
    sched, seq = _decode_ready()
    plan = sched.widen(sched.schedule(0.0), {seq.seq_id: (11, 12, 13, 14, 15, 16)})
    (chunk,) = plan.batch.chunks
    assert chunk.token_ids == (10, 11, 12, 13, 14, 15, 16) and chunk.num_logits == 7
    assert chunk.start_pos == 5 and len(seq.pages) == 3  # positions 5..11: through page 2
    free = sched.pool.num_free
    sched.commit(plan, [(11, 42)], 0.0)  # draft 1 accepted, 42 replaces draft 2
    assert seq.output_ids == [10, 11, 42]
    assert seq.computed == 7 and seq.known == 8  # KV of 10 and 11 kept; 42 is fed next
    assert len(seq.pages) == 2 and sched.pool.num_free == free + 1  # page 2: rejected only
    assert seq.spec.rounds == 1 and seq.spec.drafted_tokens == 6
    assert seq.spec.accepted_tokens == 1 and seq.spec.accepted_per_position[:2] == [1, 0]
    sched.check()
    plan = sched.schedule(0.0)  # the next step decodes 42 at position 7 on the kept page
    assert plan.batch.chunks[0].token_ids == (42,) and plan.batch.chunks[0].start_pos == 7
    sched.check()


def test_eos_inside_a_round_finishes_there():
    sched, seq = _decode_ready()
    plan = sched.widen(sched.schedule(0.0), {seq.seq_id: (11, EOS, 13)})
    sched.commit(plan, [(11, EOS, 13, 7)], 0.0)
    assert seq.output_ids == [10, 11, EOS] and seq.finish_reason == "stop"
    held = [p for p in range(16) if sched.pool.refcount(p)]
    assert held and all(sched.pool.is_cached(p) for p in held)  # only the retained prefix
    sched.check()


def test_the_window_leaves_room_for_the_bonus_token_within_max_tokens():
    sched, seq = _decode_ready(max_tokens=4, k=6)
    assert sched.spec_window(seq) == 2  # 1 output so far: 2 drafts + 1 = 4
    plan = sched.widen(sched.schedule(0.0), {seq.seq_id: (11, 12, 13, 14)})
    assert plan.batch.chunks[0].token_ids == (10, 11, 12)  # drafts past the window dropped
    sched.commit(plan, [(11, 12, 13)], 0.0)
    assert seq.output_ids == [10, 11, 12, 13] and seq.finish_reason == "length"


def test_a_row_without_drafts_is_a_fallback_step():
    sched, seq = _decode_ready()
    plan = sched.widen(sched.schedule(0.0), {})
    assert plan.batch.chunks[0].token_ids == (10,)
    sched.commit(plan, [11], 0.0)
    assert seq.spec.fallback_steps == 1 and sched.counters.spec_fallback_steps == 1
    assert seq.spec.rounds == 0

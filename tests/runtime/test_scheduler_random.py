"""Randomized interleavings of submits (several choices of one prompt among them), cancels
and steps on small pools.

Whatever the order, pressure and reuse, every request must publish exactly the tokens the
fake model produces for it alone (a prefix of them when cancelled or cut by the pool), and
the scheduler's page, lane and cache invariants must hold after every step.
"""

from __future__ import annotations

import pytest
from fake_executor import SchedulerHarness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.request import EngineOverloaded
from ninfer.runtime.sequence import SeqStatus

BASE = [3, 9, 4, 17, 22, 5, 11, 30, 2, 8, 14, 6, 25, 19, 7, 12]  # shared-prefix material


@st.composite
def configs(draw, hybrid_reuse: bool = False):
    """Engine options; `hybrid_reuse` pins a hybrid model with prefix reuse and spare slots."""
    ps = draw(st.integers(2, 4))
    lanes = draw(st.integers(1, 3))
    return {
        "config": EngineOptions.of(
            max_concurrency=lanes,
            max_pending_requests=32,
            page_size=ps,
            kv_capacity=ps * draw(st.integers(4, 12)),
            max_context=draw(st.sampled_from([24, 64])),
            prefill_chunk=draw(st.integers(1, 9)),
            prefix_reuse=hybrid_reuse or draw(st.sampled_from([True, True, False])),
            device_state_slots=draw(st.integers(1 if hybrid_reuse else 0, 4)),
            admission_bypass=draw(st.integers(0, 2)),
        ),
        "hybrid": hybrid_reuse or draw(st.booleans()),
    }


submit = st.tuples(
    st.just("submit"),
    st.one_of(st.just(len(BASE)), st.integers(0, len(BASE))),  # shared prefix length
    st.lists(st.integers(1, 31), max_size=8),  # own suffix
    st.integers(1, 24),  # max_tokens
    st.booleans(),  # sampled (temperature 0.8, seeded) vs greedy
    st.lists(st.integers(1, 20), max_size=2),  # checkpoint positions
)
choices = st.tuples(  # n choices of one prompt (runtime/choices.py), seeded sampling
    st.just("choices"),
    st.integers(2, 3),
    st.integers(0, len(BASE)),  # shared prefix length
    st.lists(st.integers(1, 31), max_size=8),  # own suffix
    st.integers(1, 12),  # max_tokens
)
ops = st.lists(submit, min_size=2, max_size=4).flatmap(
    lambda first: st.lists(
        st.one_of(
            submit,
            choices,
            st.tuples(st.just("cancel"), st.integers(0, 20)),
            st.tuples(
                st.just("continue"), st.integers(0, 20), st.lists(st.integers(1, 31), max_size=3)
            ),
            st.tuples(st.just("step"), st.integers(1, 4)),
        ),
        max_size=25,
    ).map(lambda rest: first + rest)
)


# Examples per run (CI time; each run draws new ones, so runs add up): 100 and 70, were 150
# and 100, which cost 21 s of the suite's budget together.
@pytest.mark.parametrize("overlap", [False, True])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), ops)
def test_random_interleavings_reproduce_solo_runs(overlap, cfg, operations):
    check_interleaving(cfg, operations, overlap)


@pytest.mark.parametrize("overlap", [False, True])
@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(hybrid_reuse=True), ops)
def test_random_interleavings_with_hybrid_checkpoints(overlap, cfg, operations):
    check_interleaving(cfg, operations, overlap)


def check_interleaving(cfg, operations, overlap=False):
    """`overlap`: decode steps run ahead of the last commit where the scheduler allows."""
    h = SchedulerHarness(cfg["config"], is_hybrid=cfg["hybrid"], eos_ids=(0,), overlap=overlap)
    kv_tokens = cfg["config"].num_pages * cfg["config"].page_size
    seqs = []
    for op in operations:
        if op[0] == "submit":
            _, shared, suffix, max_tokens, sampled, marks = op
            prompt = (BASE[:shared] + suffix)[:kv_tokens] or [1]
            if len(prompt) >= cfg["config"].max_context:
                prompt = prompt[: cfg["config"].max_context - 1]
            params = {"max_tokens": max_tokens, "checkpoint_positions": tuple(marks)}
            if sampled:
                params.update(temperature=0.8, top_k=8, seed=len(seqs))
            try:
                seqs.append(h.add(prompt, **params))
            except EngineOverloaded:
                pass
        elif op[0] == "choices":
            _, n, shared, suffix, max_tokens = op
            prompt = (BASE[:shared] + suffix)[: min(kv_tokens, cfg["config"].max_context - 1)]
            leader = None
            for i in range(n):
                params = {"max_tokens": max_tokens, "temperature": 1.0, "seed": len(seqs) + i}
                try:
                    seq = h.add(prompt or [1], leader=leader, **params)
                except EngineOverloaded:
                    break
                seqs.append(seq)
                leader = seq.seq_id if leader is None else leader
        elif op[0] == "continue" and seqs:  # a next turn: an earlier request's history + more
            prev = seqs[op[1] % len(seqs)]
            prompt = (prev.tokens + op[2])[: min(kv_tokens, cfg["config"].max_context - 1)]
            seqs.append(h.add(prompt, max_tokens=4, session_key=f"s{prev.seq_id % 2}"))
        elif op[0] != "continue":
            h.cancel_or_step(op, seqs)
    h.run()
    assert not h.sched.running and not h.sched.paused and not h.sched.waiting
    assert h.sched.pool.num_used == h.sched.pool.num_reclaimable  # only the cache holds pages
    for seq in seqs:
        assert seq.status is SeqStatus.FINISHED
        h.assert_correct(seq)
    c = h.sched.counters
    assert c.generation_tokens == sum(s.num_output for s in seqs)
    assert c.replayed_tokens == sum(s.replayed_tokens for s in seqs)
    assert c.preemptions == sum(s.preemptions for s in seqs)
    assert sum(c.outcomes.values()) == len(seqs)

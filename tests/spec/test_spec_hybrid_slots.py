"""Hybrid (Gated DeltaNet) models roll a round back without copying: a verify chunk writes the
recurrent state after each of its positions into its own round slot, and the commit makes the
slot of the last committed position the sequence's slot.

1. The real CPU executor on the qwen3_5 fixture: a verify chunk of 5 tokens gives the logits,
   and in round slot t exactly the state (conv tail and delta-rule state of every layer), that
   decoding the same tokens one by one gives after token t.
2. The scheduler: a verify chunk reads the sequence's slot and spills into its lane's k + 1
   round slots; after accepting m tokens the sequence continues from round slot m - 1, and a
   page-boundary checkpoint inside the round is copied from the slot of that position.
"""

from __future__ import annotations

import torch

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.executors.cpu.executor import executor_for
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.scheduler import Scheduler
from ninfer.runtime.step import SeqChunk, StateCopy, StepBatch

PROMPT = tuple(range(3, 13))  # 10 tokens
DRAFTS = (40, 41, 42, 43, 44)


def test_a_verify_chunk_leaves_each_position_state_in_its_round_slot(fixture_artifacts):
    ex = executor_for(
        str(fixture_artifacts("qwen3_5")), max_concurrency=2, kv_capacity=256, max_context=128,
        page_size=16, spec_state_slots=8,
    )  # fmt: skip
    rounds = (0, 4, 5, 6, 7)  # lane 0 and its four round slots (2 lanes + 2 checkpoints + 8)
    assert ex.num_state_slots == 12
    # lane 0: prompt, then one verify chunk of the five tokens
    ex.run(StepBatch((SeqChunk(0, PROMPT, 0, (0,), 0),)))
    verify = ex.run(StepBatch((SeqChunk(0, DRAFTS, 10, (0,), 0, True, 5, rounds),)))
    assert verify.shape[0] == 5
    # lane 1: the same prompt, then the tokens one at a time
    ex.run(StepBatch((SeqChunk(1, PROMPT, 0, (1,), 1),)))
    for t, tok in enumerate(DRAFTS):
        (row,) = ex.run(StepBatch((SeqChunk(1, (tok,), 10 + t, (1,), 1),)))
        torch.testing.assert_close(verify[t], row, rtol=1e-4, atol=1e-4)
        for layer in ex.state.ssm:
            torch.testing.assert_close(ex.state.ssm[layer][rounds[t]], ex.state.ssm[layer][1])
            torch.testing.assert_close(ex.state.conv[layer][rounds[t]], ex.state.conv[layer][1])


def test_the_accepted_count_selects_the_round_slot():
    k, lanes = 4, 2
    config = EngineOptions.of(
        max_concurrency=lanes, max_context=256, kv_capacity=64, page_size=4, spec="draft",
        draft_model="unused.ninfer", draft_tokens=k,
    )  # fmt: skip
    slots = config.compile.state_slots
    assert slots == lanes + lanes + lanes * k
    sched = Scheduler(config, num_pages=16, page_size=4, num_state_slots=slots, is_hybrid=True)
    seq = sched.add(Request((1, 2, 3, 4, 5, 6), SamplingParams(max_tokens=50)), 0.0)
    while seq.num_output == 0:  # prefill, split at the page boundary 4; first token 10
        plan = sched.schedule(0.0)
        sched.commit(plan, [10] * len(plan.logit_seqs), 0.0)
    assert seq.slot == seq.lane and seq.computed == 6
    sched.commit(sched.schedule(0.0), [11], 0.0)  # a plain decode step: computed 7
    round_slots = sched.round_slots(seq)
    assert len(set(round_slots)) == k + 1 and round_slots[0] == seq.lane
    assert all(s >= slots - lanes * k for s in round_slots[1:])
    plan = sched.widen(sched.schedule(0.0), {seq.seq_id: (12, 13, 14, 15)})
    (chunk,) = plan.batch.chunks
    assert chunk.state_slot == seq.lane and chunk.spill_slots == round_slots
    # positions 7..11 hold 11 12 13 14 15: 12 13 14 accepted, 99 replaces 15; so positions
    # 7..10 are computed and the state after position 10 is in round slot 3
    sched.commit(plan, [(12, 13, 14, 99)], 0.0)
    assert seq.computed == 11 and seq.slot == round_slots[3]
    plan = sched.schedule(0.0)  # the boundary 8's checkpoint: the state after position 7
    assert StateCopy(round_slots[0], seq.rolling_slot) in plan.batch.state_copies
    assert plan.batch.chunks[0].state_slot == round_slots[3]  # it continues from the slot
    sched.check()

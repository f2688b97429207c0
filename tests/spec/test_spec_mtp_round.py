"""The MTP drafter's device-fed greedy round (each step's pick and output hidden fed back on
the device, one host sync; on CUDA the steps replayed as one CUDA Graph chain) drafts exactly
the tokens of the step-by-step round through choose_draft: rounds of different windows in one
batch, a first step of several tokens per row (drafts accepted), a repeated tip (one token per
row: the whole round is one chain), with the full and the reduced LM head. And the hidden
rows the drafter keeps per position (HiddenRows) supersede, drop and read as the dict of rows
they replaced did."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.format import Artifact
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import SamplingParams
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.spec.drafter import DraftRow
from ninfer.spec.mtp_rows import HiddenRows

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]  # fmt: skip
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ((5, 9, 13, 200, 7, 3, 31, 44, 90, 11, 12), (17, 3, 8, 100, 101))


def _rounds(target, device: str, device_rounds: bool, lm_head_draft: bool) -> tuple[list, int]:
    """The drafts of five rounds over two sequences driven as the engine drives them (target
    prefill / verify steps observed by the drafter), and how many rounds took the device path."""
    options = EngineOptions.of(
        device=device, dtype="float32", kv_dtype="f32", max_concurrency=4, max_context=256,
        kv_capacity=1024, page_size=16, prefix_reuse=False, spec="mtp", draft_tokens=3,
        lm_head_draft=lm_head_draft,
    )  # fmt: skip
    engine = build_engine(Artifact(target), options)
    try:
        ex, spec = engine.executor, engine.speculator
        spec.drafter.device_rounds = device_rounds
        tables = (tuple(range(16)), tuple(range(16, 32)))
        batch = StepBatch(tuple(SeqChunk(i, p, 0, tables[i]) for i, p in enumerate(PROMPTS)))
        ex.run(batch)
        spec.observe(batch, ex)
        tokens = [(*p, 40 + i) for i, p in enumerate(PROMPTS)]
        seen = []
        # (k per row, drafts accepted per row before the target's own token)
        for ks, accept in (((3, 1), (2, 1)), ((3, 3), (0, 0)), ((2, 3), (1, 3)), ((1, 2), None)):
            rows = [DraftRow(i, tokens[i], len(PROMPTS[i]), k, GREEDY) for i, k in enumerate(ks)]
            drafts = spec.drafter.propose(rows, Sampler())
            seen.append([d.tokens for d in drafts])
            assert [len(d.tokens) for d in drafts] == list(ks)
            assert all(d.probs is None for d in drafts)
            if accept is None:  # a round again with nothing new: the head redoes the tip
                seen.append([d.tokens for d in spec.drafter.propose(rows, Sampler())])
                break
            chunks = tuple(
                SeqChunk(i, (tokens[i][-1], *d.tokens), len(tokens[i]) - 1, tables[i],
                         num_logits=1 + len(d.tokens))
                for i, d in enumerate(drafts)
            )  # fmt: skip
            ex.run(StepBatch(chunks))
            spec.observe(StepBatch(chunks), ex)
            for i, (d, a) in enumerate(zip(drafts, accept)):
                tokens[i] = (*tokens[i], *d.tokens[:a], 300 + len(tokens[i]))
        chains = getattr(spec.drafter.executor, "_chains", {})  # CUDA: the graph chains run
        assert not device_rounds or device == "cpu" or chains
        # and a first step of several positions per row ran in a chain graph as one-token
        # rows (more rows than the two of the later steps: keys are (first, rows, steps))
        assert not device_rounds or device == "cpu" or max(k[0] - k[1] for k in chains) > 0
        return seen, spec.drafter.fed_rounds
    finally:
        engine.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lm_head_draft", [False, True])
def test_the_device_fed_round_drafts_what_the_step_by_step_round_does(
    device, lm_head_draft, mtp_artifacts
):
    target = mtp_artifacts("qwen3")
    want, slow = _rounds(target, device, False, lm_head_draft)
    got, fast = _rounds(target, device, True, lm_head_draft)
    assert got == want
    assert (slow, fast) == (0, len(want))
    assert len({d for r in want for t in r for d in t}) > 3  # the head drafts varied tokens


def test_sampled_and_penalised_rows_keep_the_step_by_step_round(mtp_artifacts):
    options = EngineOptions.of(device="cpu", dtype="float32", max_concurrency=2, spec="mtp",
                               draft_tokens=2, page_size=16)  # fmt: skip
    engine = build_engine(Artifact(mtp_artifacts("qwen3")), options)
    try:
        ex, spec = engine.executor, engine.speculator
        batch = StepBatch((SeqChunk(0, PROMPTS[0], 0, tuple(range(4))),))
        ex.run(batch)
        spec.observe(batch, ex)
        for params in (SamplingParams(temperature=0.8, seed=1),
                       SamplingParams(temperature=0.0, presence_penalty=0.5)):  # fmt: skip
            row = DraftRow(0, (*PROMPTS[0], 40), len(PROMPTS[0]), 2, params)
            (d,) = spec.drafter.propose([row], Sampler())
            assert len(d.tokens) == 2
            assert (d.probs is None) == params.greedy
        assert spec.drafter.fed_rounds == 0
    finally:
        engine.close()


def test_hidden_rows_supersede_drop_and_read_by_position():
    rows = HiddenRows()
    block = torch.arange(10.0)[:, None].repeat(1, 3)  # row p holds p
    rows.put(5, block[5:10])
    assert rows.has(5, 10) and not rows.has(4, 6) and rows.first() == 5
    rows.put(8, block[:4] + 100)  # a later step recomputed from position 8 on
    assert rows.take(6, 10)[:, 0].tolist() == [6, 7, 100, 101]
    assert rows.has(5, 12) and not rows.has(5, 13)
    rows.put(20, block[:2])  # a gap (positions 12..19 never computed here)
    assert not rows.has(10, 21) and rows.has(20, 22) and 21 in rows and 15 not in rows
    rows.drop_below(7)
    assert rows.first() == 7 and 6 not in rows
    rows.drop_from(9)
    assert rows.take(7, 9)[:, 0].tolist() == [7, 100] and 20 not in rows
    with pytest.raises(KeyError, match="position 9"):
        rows.take(7, 10)
    rows.drop_below(9)
    assert rows.first() is None and not rows.has(0, 1) and rows.has(3, 3)

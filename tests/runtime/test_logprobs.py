"""Log probabilities of sampled tokens: which distribution they describe, and that they reach
`TokensEvent` / `ninfer.LLM` without changing what is sampled."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from ninfer import LLM, SamplingParams
from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.runtime.request import RequestError

pytestmark = pytest.mark.usefixtures("one_thread")


def row(seq_id=0, out=(), **params) -> SampleRow:
    return SampleRow(seq_id, SamplingParams(**params), list(out))


def test_greedy_rows_report_the_log_softmax_of_the_penalised_logits():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0], [0.0, 3.0, 2.5, 0.0]])
    rows = [row(temperature=0.0, logprobs=2), row(1, out=[1], temperature=0.0, presence_penalty=1.0, logprobs=4)]  # fmt: skip
    tokens = Sampler().sample_async(logits, rows)
    assert tokens.tolist() == [1, 2]  # row 1: token 1 penalised below token 2
    a, b = tokens.logprob_entries()
    ref = torch.log_softmax(logits[0], -1)
    assert a.token_id == 1 and a.logprob == pytest.approx(float(ref[1]), abs=1e-6)
    assert [t for t, _ in a.top] == [1, 2] and a.top[0][1] == pytest.approx(a.logprob)
    penalised = torch.log_softmax(logits[1] - torch.tensor([0.0, 1.0, 0.0, 0.0]), -1)
    assert b.logprob == pytest.approx(float(penalised[2]), abs=1e-6)
    assert [t for t, _ in b.top][:2] == [2, 1] and len(b.top) == 4  # 0 and 3 tie
    assert [v for _, v in b.top] == sorted((v for _, v in b.top), reverse=True)


def test_sampled_rows_report_the_filtered_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, -3.0, 0.0]])
    params = {"temperature": 0.5, "top_k": 3, "seed": 7, "logprobs": 5}
    tokens = Sampler().sample_async(logits, [row(**params)])
    (entry,) = tokens.logprob_entries()
    probs = Sampler.probabilities(logits, [SamplingParams(**params)])[0]
    assert entry.token_id == tokens.tolist()[0]
    assert math.exp(entry.logprob) == pytest.approx(float(probs[entry.token_id]), rel=1e-5)
    top = dict(entry.top)
    assert [t for t, _ in entry.top][:3] == [0, 1, 2] and len(top) == 5
    for t in (0, 1, 2):  # kept by top-k: the renormalised probabilities
        assert math.exp(top[t]) == pytest.approx(float(probs[t]), rel=1e-5)
    assert top[3] == -math.inf and top[4] == -math.inf  # removed by top-k


def test_asking_rows_do_not_change_what_is_sampled():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    plain = [row(i, temperature=0.9, top_p=0.8, seed=100 + i) for i in range(4)]
    asking = [
        row(i, temperature=0.9, top_p=0.8, seed=100 + i, logprobs=3 if i % 2 else None)
        for i in range(4)
    ]
    a = Sampler().sample_async(logits, plain)
    b = Sampler().sample_async(logits, asking)
    assert a.tolist() == b.tolist() and a.logprobs is None
    entries = b.logprob_entries()
    assert entries[0] is None and entries[2] is None
    assert [e.token_id for e in (entries[1], entries[3])] == [b.tolist()[1], b.tolist()[3]]
    assert all(len(e.top) == 3 for e in (entries[1], entries[3]))


def test_logprobs_bounds():
    with pytest.raises(RequestError, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(RequestError, match="logprobs"):
        SamplingParams(logprobs=True)


@functools.cache
def _llm(path: str) -> LLM:
    return LLM(path, max_concurrency=2, kv_capacity=1024, prefill_chunk=8)


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_greedy_logprobs_equal_log_softmax_of_llm_logits(arch, fixture_artifacts) -> None:
    """Each generated token's logprob equals log_softmax of `LLM.logits` at its position, in a
    batch beside a request that does not ask (whose tokens are unchanged)."""
    llm = _llm(str(fixture_artifacts(arch)))
    prompt = llm.tokenizer.encode("The quick brown fox")
    ask = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=5)
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    out, other = llm.generate([prompt, "Hello"], [ask, plain])
    assert other.logprobs is None
    assert other.token_ids == llm.generate(["Hello"], plain)[0].token_ids
    assert len(out.logprobs) == len(out.token_ids) == 6
    logits = llm.logits(prompt + out.token_ids[:-1])  # [len, vocab]
    ref = torch.log_softmax(logits[len(prompt) - 1 :], dim=-1)  # the positions that chose
    for i, (tid, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry.token_id == tid
        assert entry.logprob == pytest.approx(float(ref[i, tid]), abs=1e-4)
        assert len(entry.top) == 5
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)
        assert entry.top[0] == (tid, pytest.approx(entry.logprob))  # greedy: the top token
        for t, v in entry.top:
            assert v == pytest.approx(float(ref[i, t]), abs=1e-4)

"""Sampler: greedy, temperature, top-k/top-p/min-p, penalties, per-request seeded draws."""

from __future__ import annotations

import math

import pytest
import torch

from ninfer.runtime.executors.sampler import Sampler, SampleRow
from ninfer.runtime.request import RequestError, SamplingParams


def row(seq_id=0, out=(), **params) -> SampleRow:
    return SampleRow(seq_id, SamplingParams(**params), list(out))


def test_greedy_is_argmax_and_leaves_logits_untouched():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0], [5.0, 0.0, 0.0, 4.0]])
    before = logits.clone()
    assert Sampler().sample(logits, [row(temperature=0.0), row(1, temperature=0.0)]) == [1, 0]
    assert torch.equal(logits, before)


def test_penalties_apply_to_generated_tokens():
    logits = torch.tensor([[0.0, 3.0, 2.5, 0.0]])
    s = Sampler()
    # token 1 was generated twice: frequency 0.2*2 + presence 0.2 = 0.6 -> 2.4 < 2.5
    assert s.sample(
        logits, [row(out=[1, 1], temperature=0.0, frequency_penalty=0.2, presence_penalty=0.2)]
    ) == [2]
    assert s.sample(logits, [row(out=[1, 1], temperature=0.0, frequency_penalty=0.1)]) == [1]
    # a negative presence penalty encourages repetition
    assert s.sample(logits, [row(out=[3], temperature=0.0, presence_penalty=-2.0)]) == [1]
    assert s.sample(
        logits, [row(out=[3], temperature=0.0, presence_penalty=-2.0, frequency_penalty=-2.0)]
    ) == [3]


def test_filters_give_the_expected_distribution():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    x = p.log()[None]  # softmax(x) == p
    probs = lambda **kw: Sampler.probabilities(x, [SamplingParams(**kw)])[0]
    torch.testing.assert_close(probs(), p)
    torch.testing.assert_close(probs(top_k=2), torch.tensor([0.625, 0.375, 0, 0]))
    # top-p keeps the smallest head whose mass reaches p: 0.5 < 0.6, 0.8 >= 0.6
    torch.testing.assert_close(probs(top_p=0.6), torch.tensor([0.625, 0.375, 0, 0]))
    torch.testing.assert_close(probs(top_p=0.5), torch.tensor([1.0, 0, 0, 0]))
    # min-p keeps tokens with p >= min_p * p_max: 0.3 >= 0.25, 0.15 < 0.25
    torch.testing.assert_close(probs(min_p=0.5), torch.tensor([0.625, 0.375, 0, 0]))
    t = 0.5  # temperature sharpens: p_i^(1/T) renormalised
    sharp = p ** (1 / t) / (p ** (1 / t)).sum()
    torch.testing.assert_close(probs(temperature=t), sharp)


def test_top_p_one_keeps_the_whole_tail_of_a_large_vocabulary():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 151936, generator=g) * 3  # Qwen's vocabulary: the fp32 cumsum hits 1.0
    probs = Sampler.probabilities(x, [SamplingParams(temperature=0.7, top_p=1.0)])
    assert bool((probs > 0).all())
    want = torch.softmax(x / 0.7, dim=-1)
    assert torch.allclose(probs, want, rtol=1e-4, atol=1e-12)


def test_draws_follow_the_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    s = Sampler()
    n = 3000
    counts = [0] * 4
    for _ in range(n):
        counts[s.sample(logits, [row(seq_id=7, seed=123)])[0]] += 1
    expected = torch.softmax(logits[0], dim=0).tolist()
    for c, e in zip(counts, expected):
        assert abs(c / n - e) < 4 * math.sqrt(e * (1 - e) / n) + 1e-3


def test_seeded_draws_are_reproducible_and_independent_of_the_batch():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 50, generator=g)
    params = {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 42}

    def alone(n):
        s = Sampler()
        return [s.sample(logits[1:2], [row(seq_id=9, **params)])[0] for _ in range(n)]

    s = Sampler()
    batched = []
    for _ in range(20):  # the same request sampled beside two others with their own seeds
        rows = [row(1, seed=1, temperature=0.7), row(9, **params), row(3, temperature=0.0)]
        batched.append(s.sample(logits, rows)[1])
    assert batched == alone(20)
    other = Sampler()
    different = [
        other.sample(logits[1:2], [row(seq_id=9, **{**params, "seed": 43})])[0] for _ in range(20)
    ]
    assert different != batched


def test_forget_restarts_the_request_stream():
    logits = torch.zeros(1, 100)
    s = Sampler()
    first = [s.sample(logits, [row(seed=3)])[0] for _ in range(5)]
    s.forget(0)
    assert [s.sample(logits, [row(seed=3)])[0] for _ in range(5)] == first


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1.0},
        {"top_p": -0.1},
        {"min_p": 1.5},
        {"max_tokens": 0},
        {"presence_penalty": 3.0},
    ],
)
def test_invalid_parameters_are_user_errors(bad):
    with pytest.raises(RequestError):
        SamplingParams(**bad)

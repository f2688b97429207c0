"""Sampled speculation is distributed exactly as plain sampling (temperature 0.7, top-p 0.9).

1. `rejection_sample` on two real distributions (the qwen3 fixture as target p, the llama
   fixture as draft q, which overlap only partly): its first token follows p, and the same
   chi-square statistic rejects a deliberately wrong rule (resampling from p instead of the
   residual), so the test has the power to fail.
2. Through the engine: the token of the first speculative round (drafted by the llama fixture,
   by the qwen3 fixture's random MTP head with `--spec mtp`, with and without
   `--lm-head-draft`, or by a random DFlash drafter attached to qwen3 with `--spec dflash`;
   verified by qwen3) over 2000 seeded requests follows its exact distribution without
   speculation, sum over the first token t1 of p(t1) p(t2 | t1), computed from the target's
   logits. A fixed seed gives a fixed output.
"""

from __future__ import annotations

import pytest
import torch

from ninfer import LLM
from ninfer.runtime.config import NO_TIMEOUT_MS
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, SamplingParams
from ninfer.spec.verify import rejection_sample
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import make_engine, run

PARAMS = SamplingParams(temperature=0.7, top_p=0.9)
PROMPT = (5, 6, 7, 8, 9)
ALPHA = 1e-3  # false-alarm rate of each goodness-of-fit test


def chi_square_p_value(
    counts: torch.Tensor, expected: torch.Tensor, min_bin: float = 0.02
) -> float:
    """Goodness of fit of token `counts` [vocab] to probabilities `expected` [vocab]: tokens
    sorted by probability are grouped into bins of at least `min_bin` mass each (so every bin
    expects enough draws); returns the p-value of Pearson's statistic."""
    n = counts.sum()
    order = expected.argsort(descending=True)
    bins_c, bins_e, c, e = [], [], 0.0, 0.0
    for t in order.tolist():
        c, e = c + float(counts[t]), e + float(expected[t])
        if e >= min_bin:
            bins_c.append(c)
            bins_e.append(e)
            c, e = 0.0, 0.0
    bins_c[-1] += c
    bins_e[-1] += e
    obs, exp = (
        torch.tensor(bins_c, dtype=torch.float64),
        torch.tensor(bins_e, dtype=torch.float64) * n,
    )
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = torch.tensor((len(bins_c) - 1) / 2, dtype=torch.float64)
    assert dof >= 10, "too few bins for a meaningful test"
    return float(torch.special.gammaincc(dof, stat / 2))


def _probs(path, history) -> torch.Tensor:
    llm = LLM(str(path), max_concurrency=1, kv_capacity=512, max_context=256)
    x = llm.logits(list(history))[-1:].float()
    return Sampler.probabilities(x, [PARAMS])[0]


def _resample_from_p(p, q, drafts, gen):
    """A wrong rule: on rejection, draw from p itself instead of the residual max(0, p - q)."""
    for j, tok in enumerate(drafts):
        if float(torch.rand((), generator=gen)) * float(q[j, tok]) < float(p[j, tok]):
            continue
        return (*drafts[:j], int(torch.multinomial(p[j], 1, generator=gen)))
    return (*drafts, int(torch.multinomial(p[len(drafts)], 1, generator=gen)))


def test_rejection_sampling_follows_the_target_and_a_wrong_rule_is_caught(fixture_artifacts):
    p0 = _probs(fixture_artifacts("qwen3"), PROMPT)
    q0 = _probs(fixture_artifacts("llama"), PROMPT)
    overlap = float(torch.minimum(p0, q0).sum())
    assert 0.1 < overlap < 0.9, overlap  # drafts are often accepted and often rejected
    p = torch.stack([p0, p0])  # the bonus row (all drafts accepted) is not what is tested here
    q = q0[None]
    gen = torch.Generator().manual_seed(0)
    n = 6000
    for rule, fits in ((rejection_sample, True), (_resample_from_p, False)):
        counts = torch.zeros_like(p0, dtype=torch.float64)
        for _ in range(n):
            d = int(torch.multinomial(q0, 1, generator=gen))
            counts[rule(p, q, (d,), gen)[0]] += 1
        pv = chi_square_p_value(counts, p0)
        assert (pv > ALPHA) == fits, (rule.__name__, pv)


@pytest.mark.parametrize("backend", ["draft", "mtp", "mtp-lm-head-draft", "dflash"])
def test_engine_speculation_samples_the_plain_distribution(
    backend, fixture_artifacts, mtp_artifacts, fixture_root
):
    if backend.startswith("mtp"):  # the qwen3 fixture's weights with an MTP head: same p
        target, draft = mtp_artifacts("qwen3"), None
        # --lm-head-draft: q is zero outside the reduced head's 128 of 512 tokens
        spec = {"spec": "mtp", "draft_tokens": 1, "lm_head_draft": backend != "mtp"}
    elif backend == "dflash":  # a random drafter attached to the qwen3 fixture: same p; its
        # drafts are accepted about a third of the time at this temperature
        from artifacts.fixture_dflash import build_dflash_fixture

        target, draft = build_dflash_fixture(fixture_artifacts("qwen3"), fixture_root), None
        spec = {"spec": "dflash", "draft_tokens": 1}
    else:
        target, draft, spec = fixture_artifacts("qwen3"), fixture_artifacts("llama"), {}
    # exact distribution of the second output token without speculation
    llm = LLM(str(target), max_concurrency=8, kv_capacity=2048, max_context=256)
    first = _probs(target, PROMPT)
    support = first.nonzero().flatten().tolist()
    x = torch.stack([llm.logits([*PROMPT, t])[-1].float() for t in support])
    second = Sampler.probabilities(x, [PARAMS] * len(support))
    expected = (first[support, None] * second).sum(0)
    # max_tokens 3: the first token comes from the prefill, the second from a round of one
    # draft (the window leaves room for the bonus token)
    # 2000 draws (CI time): the helper test above shows the statistic's power against a wrong
    # rule; put into the engine, that rule gave p-values near 1e-13 at 4000 draws, 7e-3 at 1600
    n = 2000
    requests = [
        Request(PROMPT, SamplingParams(max_tokens=3, temperature=0.7, top_p=0.9, seed=s,
                                       ignore_eos=True))
        for s in range(n)
    ]  # fmt: skip
    with make_engine(
        target,
        draft,
        k=1,
        max_concurrency=8,
        max_context=256,
        max_pending_requests=n,
        pending_timeout_ms=NO_TIMEOUT_MS,
        **spec,
    ) as engine:
        outs = run(engine, requests)
        again = run(engine, requests[:8])
        stats = settled(engine)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs[:8]]  # seeds fix output
    rounds = stats.spec_decode_rounds_total
    assert rounds >= n, stats
    accepted = stats.spec_decode_accepted_tokens_total / stats.spec_decode_draft_tokens_total
    assert 0.1 < accepted < 0.9, stats  # both branches of verification ran many times
    counts = torch.zeros_like(expected, dtype=torch.float64)
    for o in outs:
        counts[o.token_ids[1]] += 1
    assert chi_square_p_value(counts, expected) > ALPHA

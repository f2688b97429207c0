"""The engine's thinking budget, with the fake model: the early-close suffix is committed without
sampling exactly once when the budget runs out with thinking open, never after a natural close
or a finish, counts as output, and the model continues from it as from any other history."""

from __future__ import annotations

import pytest
from fake_executor import FakeExecutor, SchedulerHarness, reference_tokens

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import (
    Request,
    RequestError,
    SamplingParams,
    TokensEvent,
)

VOCAB, EOS, T, CTX = 32, (0,), 20, 128
SUFFIX = (29, 30, 31)  # stands for "guidance ... </think>"; 31 plays </think>
CLOSE = (31,)


def prompt(n: int, seed: int = 1) -> tuple[int, ...]:
    return tuple((seed * 7 + i * 13) % 31 + 1 for i in range(n))


def greedy(tokens, max_tokens: int, eos=EOS, max_context: int = CTX) -> list[int]:
    """The fake model alone on `tokens`, greedy, no engine."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=not eos)
    return reference_tokens(
        tuple(tokens), params, vocab=VOCAB, eos_ids=eos or EOS, max_context=max_context
    )


def make_engine(eos=EOS, **cfg) -> Engine:
    cfg.setdefault("page_size", 4)
    cfg.setdefault("max_context", CTX)
    config = EngineOptions.of(**cfg)
    return Engine(config, FakeExecutor(config.num_pages, config.page_size, VOCAB), Sampler(), eos)


def budget_request(p, budget: int, max_tokens: int, close=CLOSE, **sampling) -> Request:
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("ignore_eos", True)
    return Request(
        p,
        SamplingParams(max_tokens=max_tokens, **sampling),
        thinking_budget=budget,
        thinking_close_ids=close,
        thinking_suffix_ids=SUFFIX,
    )


def no_close_prompt(budget: int, n: int = 9, first_seed: int = 1) -> tuple[int, ...]:
    """A prompt whose unconstrained greedy thinking writes no close (or EOS) id in `budget`."""
    for seed in range(first_seed, first_seed + 300):
        p = prompt(n, seed)
        if not set(greedy(p, budget, eos=())) & set(CLOSE + EOS):
            return p
    raise AssertionError("no prompt without an early close")


@pytest.mark.parametrize("budget", [1, 5])
def test_the_suffix_is_forced_once_at_the_cap_and_the_model_continues_from_it(budget):
    p = no_close_prompt(budget)
    max_tokens = 30
    with make_engine() as eng:
        handle = eng.submit(budget_request(p, budget, max_tokens))
        events = list(handle)
        stats = eng.snapshot()
    fin = events[-1]
    out = list(fin.token_ids)
    thought = greedy(p, budget, eos=())
    assert out[:budget] == thought  # model-origin thinking, up to the cap
    assert out[budget : budget + len(SUFFIX)] == list(SUFFIX)  # committed, not sampled
    rest = max_tokens - budget - len(SUFFIX)
    assert out[budget + len(SUFFIX) :] == greedy((*p, *thought, *SUFFIX), rest, eos=())
    # published once, as ordinary output tokens, counted in usage and in max_tokens
    streamed = [t for e in events if isinstance(e, TokensEvent) for t in e.token_ids]
    assert streamed == out and len(out) == max_tokens
    assert fin.reason == "length" and fin.usage.completion_tokens == max_tokens
    # the request log's thinking-budget counters: the model's thinking tokens, the forced ones
    assert (fin.usage.thinking_tokens, fin.usage.thinking_forced_tokens) == (budget, len(SUFFIX))
    assert stats.generation_tokens_total == max_tokens
    assert stats.decode_tokens_total == max_tokens - 1


def test_a_natural_close_before_the_cap_forces_nothing():
    p = prompt(9, 3)
    free = greedy(p, 40, eos=())
    k = next(i for i in range(1, 20) if free[i] not in free[:i])  # the model's first "close"
    budget = k + 3  # k thinking tokens, then the close, well inside the budget
    with make_engine() as eng:
        out = eng.submit(budget_request(p, budget, 40, close=(free[k],))).result(timeout=T)
    assert list(out.token_ids) == free  # exactly the model alone: no suffix anywhere
    assert (out.usage.thinking_tokens, out.usage.thinking_forced_tokens) == (k, 0)


def test_the_close_token_written_at_the_cap_is_a_natural_close():
    p = prompt(9, 4)
    free = greedy(p, 40, eos=())
    budget = next(i for i in range(1, 20) if free[i] not in free[:i])
    with make_engine() as eng:  # tokens 1..budget are thinking; the next one closes
        out = eng.submit(budget_request(p, budget + 1, 40, close=(free[budget],))).result(timeout=T)
    assert list(out.token_ids) == free


def test_eos_at_the_cap_finishes_without_the_suffix():
    p = prompt(9, 5)
    free = greedy(p, 40, eos=())
    j = next(i for i in range(2, 20) if free[i] not in free[:i] and free[i] not in SUFFIX)
    with make_engine(eos=(free[j],)) as eng:
        req = budget_request(p, j + 1, 40, ignore_eos=False)
        out = eng.submit(req).result(timeout=T)
    assert list(out.token_ids) == free[: j + 1] and out.finish_reason == "stop"


def test_max_tokens_at_the_cap_finishes_with_length_first():
    p = no_close_prompt(6)
    with make_engine() as eng:
        out = eng.submit(budget_request(p, 6, 6)).result(timeout=T)
    assert list(out.token_ids) == greedy(p, 6, eos=()) and out.finish_reason == "length"


@pytest.mark.parametrize("room", ["max_tokens", "context"])
def test_no_partial_suffix_when_it_and_one_more_token_do_not_fit(room):
    budget = 4
    p = no_close_prompt(budget)
    fits = budget + len(SUFFIX)  # the suffix fits, the token after it does not
    max_tokens, ctx = (fits, CTX) if room == "max_tokens" else (50, len(p) + fits)
    with make_engine(max_context=ctx) as eng:
        out = eng.submit(budget_request(p, budget, max_tokens)).result(timeout=T)
    assert list(out.token_ids) == greedy(p, budget, eos=())
    assert out.finish_reason == "length" and out.usage.completion_tokens == budget
    with make_engine(max_context=ctx + 1) as eng:  # one more position: suffix + one token
        more = budget_request(p, budget, max_tokens + (room == "max_tokens"))
        out = eng.submit(more).result(timeout=T)
    assert list(out.token_ids[budget:-1]) == list(SUFFIX) and len(out.token_ids) == fits + 1


def test_a_stop_matched_before_the_suffix_drops_it_from_the_result():
    budget = 3
    p = no_close_prompt(budget)
    h = SchedulerHarness(EngineOptions.of(page_size=4, max_context=CTX), eos_ids=EOS)
    seq = h.add(p, max_tokens=30, ignore_eos=True, thinking_budget=budget,
                thinking_close_ids=CLOSE, thinking_suffix_ids=SUFFIX)  # fmt: skip
    while seq.num_output < budget + len(SUFFIX):
        h.step()
    assert seq.output_ids[budget:] == list(SUFFIX)
    h.sched.abort(seq.seq_id, "stop", h.now, keep_tokens=budget)  # the caller's stop string
    h.collect()
    assert seq.output_ids == greedy(p, budget, eos=()) and seq.finish_reason == "stop"


@pytest.mark.parametrize("hybrid", [False, True])
def test_forced_suffixes_survive_pauses_and_replay(hybrid):
    # several budgeted requests share a pool too small for all: each is paused and replayed
    # (its forced suffix included) and still produces exactly its solo output.
    cfg = EngineOptions.of(max_concurrency=3, kv_capacity=48, prefill_chunk=6, page_size=4)
    h = SchedulerHarness(cfg, is_hybrid=hybrid, eos_ids=EOS)
    seqs = []
    for i in range(5):
        budget = 2 + i
        p = no_close_prompt(budget, n=5 + i, first_seed=10 * i)
        seqs.append((h.add(p, max_tokens=20, ignore_eos=True, thinking_budget=budget,
                           thinking_close_ids=CLOSE, thinking_suffix_ids=SUFFIX), budget))  # fmt: skip
    h.run()
    assert h.sched.counters.preemptions > 0
    for seq, budget in seqs:
        p = seq.request.prompt_token_ids
        thought = greedy(p, budget, eos=())
        cont = greedy((*p, *thought, *SUFFIX), 20 - budget - len(SUFFIX), eos=())
        assert seq.output_ids == [*thought, *SUFFIX, *cont]
        assert h.published[seq.seq_id] == seq.output_ids  # each token published once


def test_a_follow_up_reuses_the_pages_of_the_forced_history():
    p = no_close_prompt(8)
    with make_engine(prefill_chunk=64) as eng:
        first = eng.submit(budget_request(p, 8, 16)).result(timeout=T)
        history = (*p, *first.token_ids)
        again = eng.submit(Request(history, SamplingParams(max_tokens=2, temperature=0)))
        out = again.result(timeout=T)
    assert out.usage.cached_tokens == (len(history) - 1) // 4 * 4  # forced KV is ordinary KV


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"thinking_budget": 0, "thinking_suffix_ids": SUFFIX}, "positive integer"),
        ({"thinking_budget": True, "thinking_suffix_ids": SUFFIX}, "positive integer"),
        ({"thinking_budget": 4}, "suffix"),
    ],
)
def test_invalid_budgets_are_request_errors(kw, message):
    with pytest.raises(RequestError, match=message):
        Request(prompt(4), **kw)

"""Several choices of one prompt (`Engine.submit_choices`, runtime/choices.py) on the engine
with the fake executor, which rebuilds every history from the tokens written in the pages a
chunk names and checks the recurrent state's digest: a wrong page copy, a shared page written
by the wrong sequence or a missing state copy changes the tokens.

- each choice equals the same request alone with its seed (the reference run, no engine);
- the prompt is computed once: the executor runs prompt + every choice's decode tokens;
- a prompt ending inside a page copies that page once per extra choice, one filling whole
  pages copies nothing;
- without a lane for them, the choices run one after the other and still equal the reference;
- cancelling a waiting choice, or the first one before its prompt is done, loses nothing.
"""

from __future__ import annotations

import threading

import pytest
from fake_executor import FakeExecutor, prompt, reference_tokens

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import AdmittedEvent, Request, SamplingParams

VOCAB, PAGE, MAX_CONTEXT = 32, 4, 128
T = 20  # seconds: generous bound for any wait here


def make_engine(hybrid: bool, lanes: int = 4, executor_cls=FakeExecutor, **options) -> Engine:
    config = EngineOptions.of(
        max_concurrency=lanes, page_size=PAGE, max_context=MAX_CONTEXT, kv_capacity=256, **options
    )
    slots = config.num_state_slots if hybrid else 0
    ex = executor_cls(config.num_pages, PAGE, VOCAB, is_hybrid=hybrid, num_state_slots=slots)
    return Engine(config, ex, Sampler(), ())  # no EOS: every choice runs to max_tokens


def choices(ids: list[int], seed: int, n: int, max_tokens: int = 6) -> list[Request]:
    return [
        Request(tuple(ids), SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + i))
        for i in range(n)
    ]


def reference(request: Request) -> list[int]:
    return reference_tokens(
        request.prompt_token_ids, request.sampling, vocab=VOCAB, eos_ids=(), max_context=MAX_CONTEXT
    )


def computed(engine: Engine) -> int:
    return sum(b.num_tokens for b in engine.executor.batches)


@pytest.mark.parametrize("reuse", [True, False], ids=["prefix-cache", "no-prefix-cache"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["attention", "hybrid"])
@pytest.mark.parametrize("length", [21, 16], ids=["partial-page", "whole-pages"])
def test_choices_equal_separate_requests_with_the_prompt_computed_once(
    hybrid, length, reuse
) -> None:
    requests = choices(prompt(length, seed=3), seed=40, n=3)
    with make_engine(hybrid, prefix_reuse=reuse) as engine:
        handles = engine.submit_choices(requests)
        outs = [h.result(T) for h in handles]
        events = [list(h) for h in handles]
        copies = [t for t in engine.executor.transfers if t[0] == "copy_page"]
        ran = computed(engine)
    assert [list(o.token_ids) for o in outs] == [reference(r) for r in requests]
    assert len({o.token_ids for o in outs}) == 3  # each its own seed stream
    # the prompt once; each choice's decode steps feed every output token but the last
    assert ran == length + sum(len(o.token_ids) - 1 for o in outs)
    assert len(copies) == (2 if length % PAGE else 0)
    for i, (out, evs) in enumerate(zip(outs, events)):
        (admitted,) = [e for e in evs if isinstance(e, AdmittedEvent)]
        assert out.usage.prompt_tokens == length
        assert admitted.cached_tokens == out.usage.cached_tokens == (length if i else 0)
        assert out.usage.prefill_tokens == (0 if i else length)


@pytest.mark.parametrize("hybrid", [False, True], ids=["attention", "hybrid"])
def test_one_lane_serves_the_choices_one_after_the_other(hybrid) -> None:
    requests = choices(prompt(22, seed=5), seed=7, n=3)
    with make_engine(hybrid, lanes=1) as engine:
        outs = [h.result(T) for h in engine.submit_choices(requests)]
        assert engine.snapshot().running == 0
    assert [list(o.token_ids) for o in outs] == [reference(r) for r in requests]


class GatedExecutor(FakeExecutor):
    """Steps wait for `gate` (to act while the first choice's prompt is in flight)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()

    def run(self, batch, fed=None):
        assert self.gate.wait(T)
        return super().run(batch, fed)


@pytest.mark.parametrize("cancel", [0, 1], ids=["first", "second"])
def test_cancelling_a_choice_before_the_prompt_is_done(cancel) -> None:
    requests = choices(prompt(30, seed=2), seed=100, n=3)
    with make_engine(False, executor_cls=GatedExecutor) as engine:
        handles = engine.submit_choices(requests)
        engine.cancel(handles[cancel])
        engine.executor.gate.set()
        outs = [h.result(T) for h in handles]
        assert engine.snapshot().waiting == 0 and engine.snapshot().running == 0
    assert outs[cancel].finish_reason == "cancelled"
    for i, (out, r) in enumerate(zip(outs, requests)):
        if i != cancel:
            assert out.finish_reason == "length" and list(out.token_ids) == reference(r)

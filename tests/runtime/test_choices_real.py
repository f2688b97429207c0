"""Several choices of one prompt on the real CPU executor (float32 tiny fixtures): the prompt is
computed exactly once (`executor.tokens_computed`), and every choice equals the same request
submitted alone with its seed, on the attention-only model (qwen3, KV pages copied) and the
hybrid one (qwen3_5, Gated DeltaNet state copied too)."""

from __future__ import annotations

import pytest
from real_engine import random_prompt, settled

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.cpu.executor import executor_for
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, SamplingParams

PAGE, MAX_CONTEXT, T = 16, 256, 60.0

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_n_choices_compute_the_prompt_once_and_equal_separate_seeded_requests(
    fixture_artifacts, arch
) -> None:
    path = str(fixture_artifacts(arch))
    ex = executor_for(
        path, max_concurrency=4, kv_capacity=1024, max_context=MAX_CONTEXT, page_size=PAGE
    )
    config = EngineOptions.of(
        max_concurrency=4, max_context=MAX_CONTEXT, kv_capacity=1024, page_size=PAGE
    )
    ids = random_prompt(53, seed=9, vocab=ex.vocab_size)  # 3 full pages and a partial one
    requests = [
        Request(ids, SamplingParams(max_tokens=7, temperature=1.0, seed=500 + i, ignore_eos=True))
        for i in range(3)
    ]
    with Engine(config, ex, Sampler(), eos_ids=()) as engine:
        before = ex.tokens_computed
        together = [h.result(T) for h in engine.submit_choices(requests)]
        ran = ex.tokens_computed - before
        settled(engine)
    # separately, each on an engine of its own (nothing cached): the reference
    alone = []
    for r in requests:
        with Engine(config, ex, Sampler(), eos_ids=()) as engine:
            alone.append(engine.submit(r).result(T).token_ids)
    assert [o.token_ids for o in together] == alone
    assert len(set(alone)) == 3
    # the prompt once, then each choice's decode steps (every output token but its last)
    assert ran == len(ids) + sum(len(o.token_ids) - 1 for o in together) == len(ids) + 3 * 6
    assert [o.usage.prefill_tokens for o in together] == [len(ids), 0, 0]
    assert [o.usage.cached_tokens for o in together] == [0, len(ids), len(ids)]


def test_copy_page_copies_every_layers_keys_and_values(fixture_artifacts) -> None:
    import torch

    ex = executor_for(str(fixture_artifacts("qwen3")), kv_capacity=64, page_size=PAGE)
    before = [t.clone() for t in ex.kv.tensors()]
    for t in ex.kv.tensors():
        t[1].normal_()
    ex.copy_page(1, 2)
    for t, old in zip(ex.kv.tensors(), before):
        assert torch.equal(t[2], t[1]) and not torch.equal(t[2], old[2])
        assert torch.equal(t[0], old[0]) and torch.equal(t[3], old[3])  # nothing else
    with pytest.raises(ValueError, match="outside"):
        ex.copy_page(0, ex.num_pages)

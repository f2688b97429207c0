"""The engine with the real CPU executor on tiny fixtures (float32): batching, KV pressure,
prefix reuse and cancellation change nothing a greedy request produces, and free what they hold.

qwen3 is the attention-only model, qwen3_5 the hybrid (Gated DeltaNet + full attention) one.
"Alone" is `ninfer.LLM` generating one prompt at a time: a separate loop over the same
executor class, one full prefill per prompt, no engine scheduler involved.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from real_engine import alone, greedy, random_prompt, settled

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors.cpu.executor import Executor, executor_for
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import (
    FIRST_OUTPUT_PARTS,
    AdmittedEvent,
    FinishEvent,
    Request,
    RequestOutput,
    TokensEvent,
)

ARCHS = ("qwen3", "qwen3_5")  # attention-only, hybrid
PAGE = 16
MAX_CONTEXT = 1024
T = 60.0  # seconds: generous bound for any wait here


def _alone(path: str, prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    return alone(path, prompt, max_tokens, kv_capacity=2048, max_context=MAX_CONTEXT)


pytestmark = pytest.mark.usefixtures("one_thread")


# -- helpers ---------------------------------------------------------------------------------


@functools.cache
def _executor(path: str, kv_capacity: int) -> Executor:
    """One executor per (model, pool size), shared by the tests' engines (one at a time).
    Compiled for 8 lanes, so a hybrid model has 8 lane slots + 8 checkpoint slots."""
    return executor_for(
        path, max_concurrency=8, kv_capacity=kv_capacity, max_context=MAX_CONTEXT, page_size=PAGE
    )


def _engine(ex: Executor, lanes: int, **options) -> Engine:
    options.setdefault("prefill_chunk", 64)
    config = EngineOptions.of(
        max_concurrency=lanes,
        max_context=MAX_CONTEXT,
        kv_capacity=ex.num_pages * ex.page_size,
        page_size=ex.page_size,
        max_pending_requests=16,
        **options,
    )
    return Engine(config, ex, Sampler(), eos_ids=())


def _run(engine: Engine, requests: list[Request]) -> list[RequestOutput]:
    handles = [engine.submit(r) for r in requests]
    return [h.result(T) for h in handles]


# 8 requests: different prompt lengths (1 to 8 pages, two of them page multiples) and output lengths;
# prefill_chunk 64 splits the long prompts, so prefill chunks mix with decode rows.
LENGTHS = (3, 9, 17, 32, 47, 64, 85, 120)
OUTPUTS = (20, 13, 24, 9, 18, 24, 11, 16)


def _batch(vocab: int) -> list[Request]:
    return [
        Request(random_prompt(n, seed=100 + i, vocab=vocab), greedy(m))
        for i, (n, m) in enumerate(zip(LENGTHS, OUTPUTS))
    ]


# -- concurrency -----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_eight_concurrent_greedy_requests_equal_each_alone(arch, fixture_artifacts):
    path = str(fixture_artifacts(arch))
    ex = _executor(path, 2048)
    requests = _batch(ex.vocab_size)
    with _engine(ex, lanes=8) as engine:
        outs = _run(engine, requests)
        stats = settled(engine)
    for i, (req, out) in enumerate(zip(requests, outs)):
        alone = _alone(path, req.prompt_token_ids, req.sampling.max_tokens)
        assert out.token_ids == alone, f"request {i} ({len(req.prompt_token_ids)} tokens)"
        assert out.finish_reason == "length"
        _check_units(out, len(req.prompt_token_ids))
    assert stats.preemptions_total == 0
    # requests really shared steps: on average well over one decode row per decode step
    assert stats.decode_rows_total >= 2 * stats.decode_rounds_total, stats


def _check_units(out: RequestOutput, prompt: int) -> None:
    """A request never paused and with no prefix hit: its first token came from its prefill,
    every later one from a decode round; the first output's observations add up."""
    t = out.timings
    assert t.units["decode_rounds"] == len(out.token_ids) - 1
    assert t.units["prefill"] >= -(-prompt // 64) and t.units["replay"] == t.units["control"] == 0
    first = t.first_output
    assert first is not None and first["prefill_tokens"] == prompt and first["replayed_tokens"] == 0
    assert first["units"]["decode_rounds"] == 0 and first["units"]["prefill"] == t.units["prefill"]
    parts = sum(first[k] for k in FIRST_OUTPUT_PARTS)
    assert parts == pytest.approx(first["engine_elapsed_seconds"])
    # published after the token was committed (ttft), before the request ended
    assert t.ttft_s <= first["engine_elapsed_seconds"] <= t.total_s and first["exposure"]
    assert t.prefill_gpu_s is None and t.transfers == {}  # a CPU executor: no device timing


@pytest.mark.parametrize("arch", ARCHS)
def test_concurrent_requests_sharing_prefixes_equal_each_alone(arch, fixture_artifacts):
    """Identical and prefix-sharing prompts run at once (pages switch to the cached copy as they
    fill), then again (their prefixes now come from the cache): nothing changes any output."""
    path = str(fixture_artifacts(arch))
    ex = _executor(path, 2048)
    system = random_prompt(48, seed=1, vocab=ex.vocab_size)  # 3 pages, marked as a checkpoint
    prompts = [
        system + random_prompt(5 + 7 * i, seed=20 + i, vocab=ex.vocab_size) for i in range(4)
    ]
    prompts += [
        prompts[0],
        prompts[1],
        system[:40] + (3, 4),
        random_prompt(70, seed=30, vocab=ex.vocab_size),
    ]
    requests = [
        Request(p, greedy(10 + i), checkpoint_positions=(len(system),))
        for i, p in enumerate(prompts)
    ]
    # 4 lanes for 8 requests (the rest join as others leave); on the hybrid model that leaves
    # 12 checkpoint slots, enough that no marked checkpoint is ever displaced
    with _engine(ex, lanes=4) as engine:
        first = _run(engine, requests)
        second = _run(engine, requests)
        stats = settled(engine)
    for i, (req, a, b) in enumerate(zip(requests, first, second)):
        alone = _alone(path, req.prompt_token_ids, req.sampling.max_tokens)
        assert a.token_ids == alone, f"request {i}, first wave"
        assert b.token_ids == alone, f"request {i}, second wave (cached {b.usage.cached_tokens})"
    # the second wave reused at least the marked system prompt wherever it is a full prefix
    assert all(b.usage.cached_tokens >= len(system) for b in second[:6]), [b.usage for b in second]
    assert stats.prompt_tokens_cached_total >= 6 * len(system)


# -- pressure: pause and restore -------------------------------------------------------------

SMALL_POOL = 192  # tokens = 12 pages: the largest request (120 + 16) fits alone, 8 do not


@pytest.mark.parametrize("prefix_reuse", [True, False], ids=["reuse", "no-reuse"])
@pytest.mark.parametrize("arch", ARCHS)
def test_pauses_under_a_small_pool_replay_to_the_same_tokens(arch, prefix_reuse, fixture_artifacts):
    path = str(fixture_artifacts(arch))
    ex = _executor(path, SMALL_POOL)
    assert ex.num_pages == SMALL_POOL // PAGE
    requests = _batch(ex.vocab_size)
    with _engine(
        ex, lanes=8, prefix_reuse=prefix_reuse, host_context_mib=0
    ) as engine:  # replay only
        outs = _run(engine, requests)
        stats = settled(engine)
    for i, (req, out) in enumerate(zip(requests, outs)):
        alone = _alone(path, req.prompt_token_ids, req.sampling.max_tokens)
        assert out.token_ids == alone, f"request {i} (paused {out.usage.preemptions} times)"
        assert out.finish_reason == "length"
    assert stats.preemptions_total > 0, stats
    assert stats.replay_restores_total > 0, stats
    assert stats.replayed_tokens_total > 0, stats
    # with reuse, finished requests' retained pages are given back under pressure
    assert (stats.cache_evicted_pages_total > 0) == prefix_reuse, stats
    assert sum(o.usage.preemptions for o in outs) == stats.preemptions_total
    assert sum(o.usage.replayed_tokens for o in outs) == stats.replayed_tokens_total
    # replay rebuilt state without publishing anything twice: output counts are exact
    assert stats.generation_tokens_total == sum(OUTPUTS)


@pytest.mark.parametrize("arch", ARCHS)
def test_pauses_restore_from_host_snapshots(arch, fixture_artifacts):
    path = str(fixture_artifacts(arch))
    ex = _executor(path, SMALL_POOL)
    requests = _batch(ex.vocab_size)
    fields = {f.name for f in dataclasses.fields(EngineOptions)}
    snapshots = {"host_context_mib": 64} if "host_context_mib" in fields else {}
    with _engine(ex, lanes=8, **snapshots) as engine:
        outs = _run(engine, requests)
        stats = settled(engine)
    for req, out in zip(requests, outs):
        assert out.token_ids == _alone(path, req.prompt_token_ids, req.sampling.max_tokens)
    assert stats.preemptions_total > 0, stats
    assert stats.snapshot_restores_total > 0, stats


# -- prefix reuse ----------------------------------------------------------------------------

LONG = 500
OUT = 8


def _submit_collect(engine: Engine, request: Request) -> tuple[RequestOutput, list]:
    """Run one request to the end, reading its event stream; returns its result and events."""
    handle = engine.submit(request)
    events = list(handle)
    return handle.result(T), events


def _computed(engine: Engine, ex: Any, request: Request) -> tuple[RequestOutput, list, int]:
    """`_submit_collect` of `request`, with the tokens the executor computed for it."""
    before = ex.tokens_computed
    out, events = _submit_collect(engine, request)
    return out, events, ex.tokens_computed - before


def _check_events(events: list, out: RequestOutput) -> None:
    """The stream announces the same reuse as the final usage, and carries every token."""
    admitted = [e for e in events if isinstance(e, AdmittedEvent)]
    assert len(admitted) == 1 and events[0] is admitted[0]
    assert admitted[0].cached_tokens == out.usage.cached_tokens
    assert admitted[0].reuse_path == out.usage.reuse_path
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.token_ids]
    assert tuple(tokens) == out.token_ids
    assert isinstance(events[-1], FinishEvent)


def test_repeated_long_prompt_reuses_cached_pages_and_skips_its_prefill(fixture_artifacts):
    path = str(fixture_artifacts("qwen3"))
    ex = _executor(path, 2048)
    request = Request(random_prompt(LONG, seed=7, vocab=ex.vocab_size), greedy(OUT))
    with _engine(ex, lanes=2) as engine:
        first, _, first_computed = _computed(engine, ex, request)
        second, events, second_computed = _computed(engine, ex, request)
        stats = settled(engine)
    assert first.usage.cached_tokens == 0 and first.usage.reuse_path == "root"
    assert first_computed == LONG + OUT - 1  # the prompt, then one decode per later token
    # every full page but the last token's: 31 pages of 16
    assert second.usage.cached_tokens >= 448, second.usage
    assert second.usage.reuse_path == "checkpoint"
    assert second.usage.prefill_tokens == LONG - second.usage.cached_tokens
    assert second_computed <= 52 + OUT
    assert second_computed == LONG - second.usage.cached_tokens + OUT - 1
    assert stats.prompt_tokens_cached_total == second.usage.cached_tokens
    assert second.token_ids == first.token_ids == _alone(path, request.prompt_token_ids, OUT)
    _check_events(events, second)


def test_hybrid_prefix_reuse_resumes_from_the_marked_checkpoint(fixture_artifacts):
    path = str(fixture_artifacts("qwen3_5"))
    ex = _executor(path, 2048)
    assert ex.is_hybrid
    prompt = random_prompt(LONG, seed=11, vocab=ex.vocab_size)
    mark = 480
    request = Request(prompt, greedy(OUT), checkpoint_positions=(mark,))
    # shares the first 490 tokens: only the checkpoint marked at 480 lies inside the shared part
    forked = prompt[:490] + random_prompt(LONG - 490, seed=12, vocab=ex.vocab_size)
    fork = Request(forked, greedy(OUT))
    with _engine(ex, lanes=2) as engine:
        first, _ = _submit_collect(engine, request)
        second, events, second_computed = _computed(engine, ex, request)
        third, fork_events, third_computed = _computed(engine, ex, fork)
        stats = settled(engine)
    # three selections, two reused a prefix; the state images the throughput log counts
    assert stats.cache_selections_total == 3 and stats.cache_selection_hits_total == 2
    assert stats.cache_selected_tokens_total == second.usage.cached_tokens + mark
    assert stats.last_cache_selection == {"tokens": mark, "path": "checkpoint",
                                          "state_checkpoint": True}  # fmt: skip
    assert stats.state_captures_total >= 1 and stats.state_restores_total == 2
    assert first.usage.cached_tokens == 0 and first.usage.reuse_path == "root"
    # same prompt again: resumes from a checkpoint at or past the mark
    assert second.usage.reuse_path == "checkpoint", second.usage
    assert second.usage.cached_tokens >= mark
    assert second_computed == LONG - second.usage.cached_tokens + OUT - 1
    assert second_computed <= LONG - mark + OUT
    assert second.token_ids == first.token_ids == _alone(path, prompt, OUT)
    _check_events(events, second)
    # the fork can only resume from the marked checkpoint, and its state there is right
    assert fork_events and third.usage.reuse_path == "checkpoint", third.usage
    assert third.usage.cached_tokens == mark
    assert third_computed == LONG - mark + OUT - 1
    assert third.token_ids == _alone(path, forked, OUT)
    _check_events(fork_events, third)


# -- cancellation ----------------------------------------------------------------------------


def _four_requests(vocab: int, first_len: int, seed: int, max_tokens: int) -> list[Request]:
    """Four greedy requests of `max_tokens` on random prompts 9 tokens apart in length."""
    return [
        Request(random_prompt(first_len + 9 * i, seed=seed + i, vocab=vocab), greedy(max_tokens))
        for i in range(4)
    ]


def _cancel_mid_decode(engine: Engine, requests: list[Request]) -> list[RequestOutput]:
    """Submit all, and cancel each once its first output tokens have been read."""
    handles = [engine.submit(r) for r in requests]
    for h in handles:
        for event in h:
            if isinstance(event, (TokensEvent, FinishEvent)):
                break
        h.cancel()
    return [h.result(T) for h in handles]


@pytest.mark.parametrize("arch", ARCHS)
def test_cancel_mid_decode_frees_lanes_pages_and_slots(arch, fixture_artifacts):
    path = str(fixture_artifacts(arch))
    ex = _executor(path, SMALL_POOL)
    vocab = ex.vocab_size
    # each fits the pool alone (47 + 140 <= 192), so none can end by itself before its cancel
    requests = _four_requests(vocab, first_len=20, seed=200, max_tokens=140)
    with _engine(ex, lanes=4, prefix_reuse=False) as engine:
        outs = _cancel_mid_decode(engine, requests)
        stats = settled(engine)
        assert all(o.finish_reason == "cancelled" for o in outs), [o.finish_reason for o in outs]
        assert all(0 < o.usage.completion_tokens < 140 for o in outs)
        assert stats.requests_by_outcome == {"cancelled": 4}
        assert stats.kv_pages_used == 0, stats
        assert stats.state_slots_used == 0, stats
        # all lanes are free again: four new requests all run at once
        again = _run(
            engine,
            [Request(random_prompt(8, seed=300 + i, vocab=vocab), greedy(4)) for i in range(4)],
        )
        assert [o.usage.completion_tokens for o in again] == [4] * 4
        assert settled(engine).kv_pages_used == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_cancelled_requests_leave_only_reclaimable_prefix_pages(arch, fixture_artifacts):
    path = str(fixture_artifacts(arch))
    ex = _executor(path, SMALL_POOL)
    vocab = ex.vocab_size
    requests = _four_requests(vocab, first_len=40, seed=400, max_tokens=120)
    with _engine(ex, lanes=4) as engine:
        outs = _cancel_mid_decode(engine, requests)
        assert all(o.finish_reason == "cancelled" for o in outs)
        stats = settled(engine)
        assert 0 < stats.kv_pages_used < stats.kv_pages_capacity  # retained prefix pages
        # a request needing every page of the pool still runs to its end without a pause
        whole = Request(random_prompt(150, seed=500, vocab=vocab), greedy(SMALL_POOL - 150))
        (out,) = _run(engine, [whole])
        assert out.finish_reason == "length"
        assert out.usage.completion_tokens == SMALL_POOL - 150
        assert out.usage.preemptions == 0
        assert out.token_ids == _alone(path, whole.prompt_token_ids, SMALL_POOL - 150)
        assert settled(engine).kv_pages_used <= stats.kv_pages_capacity

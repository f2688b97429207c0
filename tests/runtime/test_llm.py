"""`ninfer.LLM`: batched generate, seeded sampling, stopping rules, logits, errors."""

from __future__ import annotations

import functools
import time

import pytest
import torch

from ninfer import LLM, SamplingParams
from ninfer.errors import ConfigError
from ninfer.runtime.request import RequestError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def _llm(path: str, max_concurrency: int = 2) -> LLM:
    return LLM(path, max_concurrency=max_concurrency, kv_capacity=1024, prefill_chunk=8)


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_batched_generate_equals_one_at_a_time(arch, fixture_artifacts) -> None:
    llm = _llm(str(fixture_artifacts(arch)))
    prompts = ["Hello there", "A much longer prompt that needs several prefill chunks", "x"]
    batched = llm.generate(prompts, GREEDY)  # 3 prompts over 2 lanes, chunked prefill of 8
    single = [llm.generate([p], GREEDY)[0] for p in prompts]
    assert [r.token_ids for r in batched] == [r.token_ids for r in single]
    for p, r in zip(prompts, batched):
        assert r.prompt_token_ids == llm.tokenizer.encode(p)
        assert r.text == llm.tokenizer.decode(r.token_ids)
        assert r.finish_reason in ("length", "stop") and 1 <= len(r.token_ids) <= 12


def test_token_id_prompts_and_logits(fixture_artifacts) -> None:
    llm = _llm(str(fixture_artifacts("qwen3")))
    ids = llm.tokenizer.encode("The cat sat")
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))[0]
    logits = llm.logits(ids)
    assert logits.shape == (len(ids), llm.executor.vocab_size) and logits.dtype == torch.float32
    assert out.token_ids == [int(logits[-1].argmax())]


def test_seeded_sampling_is_reproducible(fixture_artifacts) -> None:
    llm = _llm(str(fixture_artifacts("qwen3_moe")))
    p = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    a = llm.generate(
        ["Once upon a time", "Hi"], [p, SamplingParams(max_tokens=16, seed=1234, ignore_eos=True)]
    )
    b = llm.generate(["Once upon a time"], p)
    assert a[0].token_ids == b[0].token_ids
    c = llm.generate(
        ["Once upon a time"],
        SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=99, ignore_eos=True),
    )
    greedy = llm.generate(
        ["Once upon a time"], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    )
    assert {tuple(a[0].token_ids), tuple(c[0].token_ids), tuple(greedy[0].token_ids)} != {
        tuple(a[0].token_ids)
    }


def test_stops_on_eos(tiny_agent, tiny_agent_prompts) -> None:
    """The trained model ends its reply with <|im_end|>: generation stops right after it (the
    id is kept, the text is not), unless ignore_eos, which runs on to max_tokens."""
    llm = _llm(str(tiny_agent))
    case = next(p for p in tiny_agent_prompts if p["name"] == "hello")
    ids = llm.tokenizer.encode(case["prompt"], add_special_tokens=False)
    stopped = llm.generate([ids], SamplingParams(max_tokens=40, temperature=0.0))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] in llm.engine.eos_ids
    assert stopped.text == case["expected"]["content"]
    n = len(stopped.token_ids)
    ignored = llm.generate(
        [ids], SamplingParams(max_tokens=n + 3, temperature=0.0, ignore_eos=True)
    )[0]
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == n + 3
    assert ignored.token_ids[:n] == stopped.token_ids


def test_stops_on_stop_strings(fixture_artifacts) -> None:
    llm = _llm(str(fixture_artifacts("llama")))
    free = llm.generate(
        ["Tell me"], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    )[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    text = llm.tokenizer.decode(free.token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if stop.strip():
        s = llm.generate(
            ["Tell me"],
            SamplingParams(max_tokens=10, temperature=0.0, stop=(stop,), ignore_eos=True),
        )[0]
        assert s.finish_reason == "stop" and stop not in s.text and text.startswith(s.text)
        # the ids end with the token that completed the stop string
        assert s.token_ids == free.token_ids[: len(s.token_ids)]
        assert stop in llm.tokenizer.decode(s.token_ids)
        assert stop not in llm.tokenizer.decode(s.token_ids[:-1])


def test_errors_are_one_line_user_errors(fixture_artifacts) -> None:
    path = str(fixture_artifacts("llama"))
    llm = _llm(path)
    with pytest.raises(RequestError, match="empty prompt"):
        llm.generate([[]], GREEDY)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        llm.logits([1, 10**6])
    with pytest.raises(RequestError, match="KV pages"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5000))
    with pytest.raises(ConfigError, match="max-concurrency"):
        LLM(path, max_concurrency=9)
    with pytest.raises(ConfigError, match="unknown engine option"):
        LLM(path, max_banana=3)


def test_the_default_budget_is_what_fits_the_kv_cache(fixture_artifacts) -> None:
    """kv_capacity below max_context: without max_tokens a prompt generates until the cache is
    full (it was refused: the default budget was max_context's)."""
    llm = LLM(str(fixture_artifacts("llama")), kv_capacity=64, max_concurrency=1)
    cache = llm.executor.num_pages * llm.executor.page_size
    assert cache < llm.options.max_context
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == cache - 3 and out.finish_reason == "length"


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"stop": [""]}, "stop strings must be non-empty strings"),
        ({"stop": [1]}, "stop strings must be non-empty strings"),
        ({"seed": 1 << 63}, "seed must be a signed 64-bit integer"),
        ({"ignore_eos": "no"}, "ignore_eos must be true or false"),
        ({"top_k": -5}, "top_k must be an integer >= 0"),
    ],
)
def test_sampling_params_are_checked_like_the_http_fields(kw, message) -> None:
    with pytest.raises(RequestError, match=message):
        SamplingParams(**kw)


def test_top_p_zero_is_argmax_and_stop_none_is_no_stop(fixture_artifacts) -> None:
    llm = _llm(str(fixture_artifacts("llama")))
    p = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.0, seed=3, stop=None)
    assert p.stop == () and p.greedy
    assert (
        llm.generate(["Hello"], p)[0].token_ids == llm.generate(["Hello"], GREEDY)[0].token_ids[:8]
    )
    with pytest.raises(RequestError, match="token ids must be integers"):
        llm.generate([[1.0, 2.0]], GREEDY)
    ids = torch.tensor([5, 17, 3])  # integer elements of numpy / torch are plain ints
    assert llm.generate([list(ids)], GREEDY)[0].prompt_token_ids == [5, 17, 3]
    assert all(type(t) is int for t in llm.generate([list(ids)], GREEDY)[0].prompt_token_ids)


def test_an_interrupted_call_leaves_nothing_behind(fixture_artifacts, monkeypatch) -> None:
    """A call interrupted midway (here: KeyboardInterrupt after three tokens were read, as
    Ctrl-C would raise it) cancels its requests before it returns: both end 'cancelled' (not
    left running to max_tokens), and the next seeded call gets what it got before (no
    generator left over)."""
    import ninfer.llm
    from ninfer.api.service.output_text import OutputText

    llm = _llm(str(fixture_artifacts("llama")))
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=42, ignore_eos=True)
    before = llm.generate(["Hello", "Hi"], seeded)
    calls = []

    class Interrupted(OutputText):
        def add(self, token_id):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return super().add(token_id)

    monkeypatch.setattr(ninfer.llm, "OutputText", Interrupted)
    long = SamplingParams(max_tokens=500, temperature=1.0, seed=42, ignore_eos=True)
    cancelled = llm.engine.snapshot().requests_by_outcome.get("cancelled", 0)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Hello", "Hi"], long)
    monkeypatch.undo()
    deadline = time.monotonic() + 10  # the stats are published at the worker's next boundary
    while (stats := llm.engine.snapshot()).running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stats.running == stats.waiting == stats.paused == 0
    assert stats.requests_by_outcome.get("cancelled", 0) == cancelled + 2
    after = llm.generate(["Hello", "Hi"], seeded)
    assert [r.token_ids for r in after] == [r.token_ids for r in before]


def test_calls_from_two_threads_are_serialised(fixture_artifacts) -> None:
    import threading

    llm = _llm(str(fixture_artifacts("llama")))
    prompts = [["Hello there", "x"], ["A much longer prompt that needs chunks", "Hi"]]
    want = [[r.token_ids for r in llm.generate(p, GREEDY)] for p in prompts]
    got: dict[int, list] = {}

    def run(i: int) -> None:
        got[i] = [r.token_ids for r in llm.generate(prompts[i], GREEDY)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[0], got[1]] == want


def test_logits_leave_the_prefix_cache_intact(fixture_artifacts) -> None:
    """`logits` runs on pages taken from the engine's pool: a prefix the cache retained from an
    earlier generate is evicted (not overwritten behind its back), so the next generate of that
    prompt gets the same tokens; and the logits agree with what generate chose."""
    llm = LLM(str(fixture_artifacts("llama")), max_concurrency=1, kv_capacity=64, prefill_chunk=8)
    prompt = [(7 * i) % 200 + 5 for i in range(40)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    other = llm.logits([(11 * i) % 200 + 3 for i in range(64)])  # the whole pool
    assert other.shape[0] == 64
    again = llm.generate([prompt], params)[0]
    assert again.token_ids == first.token_ids
    rows = llm.logits(prompt + first.token_ids[:-1])[len(prompt) - 1 :]
    assert rows.argmax(dim=-1).tolist() == first.token_ids
    with pytest.raises(RequestError, match="KV pages"):
        llm.logits(list(range(5, 70)))
    llm.close()


def test_more_prompts_than_the_engine_accepts_wait_their_turn(fixture_artifacts) -> None:
    """One lane and no pending slot: six prompts are submitted one after another as each
    finishes (none is refused as overloaded), and come back in order."""
    llm = LLM(str(fixture_artifacts("qwen3")), max_concurrency=1, max_pending_requests=0)
    prompts = [[i + 3, 2 * i + 5, 3 * i + 7] for i in range(6)]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [o.token_ids for o in outs] == [llm.generate([p], params)[0].token_ids for p in prompts]
    llm.close()


def test_no_params_means_the_artifacts_recorded_defaults(fixture_hf_dir, tmp_path) -> None:
    """generate/chat without SamplingParams sample as the server does for a request that leaves
    the fields out: with the artifact's recorded defaults (here greedy), not temperature 1."""
    from ninfer.artifact.convert_hf import convert_hf
    from ninfer.ir.models import check_tensors

    src = fixture_hf_dir("llama")
    greedy = convert_hf(
        src, tmp_path / "greedy.ninfer", generation={"temperature": 0.0}, check_model=check_tensors
    )
    llm = LLM(str(greedy), max_concurrency=2, kv_capacity=256, max_context=48)
    prompt = ["the quick brown fox"]
    plain = llm.generate(prompt)  # max_tokens from the engine's limit (the small context)
    explicit = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=len(plain[0].token_ids))
    )
    assert plain[0].token_ids == explicit[0].token_ids
    assert llm.generate(prompt)[0].token_ids == plain[0].token_ids  # deterministic: greedy

"""Log probabilities and `n` > 1 through the real server (`ninfer serve` on the tiny trained
model, CPU float32) and the official openai client:

- a greedy answer's logprobs are log_softmax of `LLM.logits` at each position (1e-4), the
  top_logprobs sorted with the chosen token first; stream and aggregate agree; Responses'
  output_text logprobs (aggregate and streamed deltas) are the same entries;
- `n: 3` with seed s returns the choices that separate requests with seeds s, s+1, s+2 return,
  with the prompt prefilled exactly once (`ninfer_prefill_tokens_total`; the engine tests
  count the executor's tokens, tests/runtime/test_choices_real.py).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import httpx
import openai
import pytest
import torch
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response
from prometheus_client.parser import text_string_to_metric_families

from ninfer import LLM, SamplingParams
from tests.e2e.conftest import TINY_AGENT
from tests.e2e.test_openai_schema_e2e import (
    CHAT_EXTENSIONS,
    RESPONSE_EXTENSIONS,
    STREAM_EVENT,
    extra_fields,
    post,
    sse_frames,
    with_cache_writes,
)

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory("--max-concurrency", "4", "--log-stats-interval-ms", "0")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def llm():
    llm = LLM(TINY_AGENT, max_concurrency=1, kv_capacity=1024)
    yield llm
    llm.close()


def chat(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny-agent", messages=QUESTION, max_tokens=10, extra_body=NO_THINKING, **kw
    )


def test_greedy_logprobs_are_the_log_softmax_of_the_logits(client, llm) -> None:
    (mine,) = llm.chat(
        QUESTION, SamplingParams(max_tokens=10, temperature=0.0), **NO_THINKING
    )  # the same prompt tokens and greedy answer as the server's
    c = chat(client, temperature=0, logprobs=True, top_logprobs=5)
    content = c.choices[0].logprobs.content
    answer = [t for t in mine.token_ids if t not in llm.eos_token_ids]  # EOS is not content
    assert len(content) == len(answer) > 0
    assert b"".join(bytes(e.bytes) for e in content).decode() == c.choices[0].message.content
    assert c.choices[0].message.content == llm.tokenizer.decode(answer)
    ref = torch.log_softmax(llm.logits(mine.prompt_token_ids + mine.token_ids), dim=-1)
    start = len(mine.prompt_token_ids) - 1  # the row that chose output token 0
    for i, (tid, e) in enumerate(zip(answer, content)):
        assert e.logprob == pytest.approx(float(ref[start + i, tid]), abs=1e-4)
        assert len(e.top_logprobs) == 5
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert e.top_logprobs[0].token == e.token  # greedy: the chosen token is the top one
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)


def test_stream_and_aggregate_agree(client) -> None:
    whole = chat(client, temperature=0.7, seed=11, logprobs=True, top_logprobs=2)
    entries, text = [], []
    for chunk in chat(client, temperature=0.7, seed=11, logprobs=True, top_logprobs=2, stream=True):
        for ch in chunk.choices:
            text.append(ch.delta.content or "")
            if ch.logprobs is not None:
                entries += ch.logprobs.content or []
    assert "".join(text) == whole.choices[0].message.content
    agg = whole.choices[0].logprobs.content
    assert [e.token for e in entries] == [e.token for e in agg]
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in agg], abs=1e-5)
    for e in agg:  # sampled: the tempered distribution; the chosen token has mass
        assert e.logprob <= 0 and math.isfinite(e.logprob) and len(e.top_logprobs) == 2
        if e.logprob >= e.top_logprobs[-1].logprob:  # within the top 2: among them
            assert e.token in [t.token for t in e.top_logprobs]


def test_without_logprobs_choices_carry_null(client) -> None:
    assert chat(client, temperature=0).choices[0].logprobs is None


def test_responses_output_text_logprobs(client) -> None:
    c = chat(client, temperature=0, logprobs=True, top_logprobs=3)
    kw: dict[str, Any] = {
        "model": "tiny-agent",
        "input": QUESTION[0]["content"],
        "temperature": 0,
        "max_output_tokens": 10,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
        "store": False,
        "extra_body": NO_THINKING,
    }
    r = client.responses.create(**kw)
    assert r.top_logprobs == 3
    (part,) = r.output[-1].content
    assert part.text == c.choices[0].message.content
    assert [(e.token, e.bytes) for e in part.logprobs] == [
        (e.token, e.bytes) for e in c.choices[0].logprobs.content
    ]
    assert [[t.token for t in e.top_logprobs] for e in part.logprobs] == [
        [t.token for t in e.top_logprobs] for e in c.choices[0].logprobs.content
    ]
    deltas, done = [], None
    for ev in client.responses.create(stream=True, **kw):
        if ev.type == "response.output_text.delta":
            deltas += ev.logprobs
        elif ev.type == "response.output_text.done":
            done = ev
    assert [e.token for e in deltas] == [e.token for e in part.logprobs]
    assert done is not None and [e.logprob for e in done.logprobs] == pytest.approx(
        [e.logprob for e in part.logprobs], abs=1e-5
    )


def prefilled(server) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "ninfer_prefill_tokens_total":
                return s.value
    raise KeyError("ninfer_prefill_tokens_total")


SEED = 1240  # its three seed streams give three different answers on this prompt (tiny-agent)


def test_n_choices_equal_separately_seeded_requests(client, server) -> None:
    # a prompt no earlier request cached, a few KV pages long
    messages = [{"role": "user", "content": "Tell me a long story about " + "a red fox, " * 12}]
    kw: dict[str, Any] = {
        "model": "tiny-agent",
        "messages": messages,
        "max_tokens": 8,
        "temperature": 1.0,
        "logprobs": True,
        "extra_body": NO_THINKING,
    }
    before = prefilled(server)
    many = client.chat.completions.create(n=3, seed=SEED, **kw)
    computed = prefilled(server) - before
    prompt = many.usage.prompt_tokens
    assert prompt > 48
    # choice 0 computes the prompt; the others take its KV and logits (the last page copied)
    assert computed == prompt
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    one = [client.chat.completions.create(seed=SEED + i, **kw).choices[0] for i in range(3)]
    assert [ch.message.content for ch in many.choices] == [ch.message.content for ch in one]
    assert len({ch.message.content for ch in many.choices}) == 3  # each its own seed
    assert [[e.token for e in ch.logprobs.content] for ch in many.choices] == [
        [e.token for e in ch.logprobs.content] for ch in one
    ]
    assert many.usage.completion_tokens == sum(
        client.chat.completions.create(seed=SEED + i, **kw).usage.completion_tokens
        for i in range(3)
    )
    assert many.usage.total_tokens == prompt + many.usage.completion_tokens


def test_n_streams_interleave_choices(client) -> None:
    kw: dict[str, Any] = {
        "model": "tiny-agent",
        "messages": QUESTION,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 5,
        "extra_body": NO_THINKING,
    }
    whole = client.chat.completions.create(n=2, **kw)
    text: dict[int, str] = {0: "", 1: ""}
    finish: dict[int, str] = {}
    usage = None
    for chunk in client.chat.completions.create(
        n=2, stream=True, stream_options={"include_usage": True}, **kw
    ):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert [text[0], text[1]] == [ch.message.content for ch in whole.choices]
    assert finish == {ch.index: ch.finish_reason for ch in whole.choices}
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_greedy_n_gives_identical_choices_and_n_is_bounded(client) -> None:
    c = chat(client, temperature=0, n=2)
    assert c.choices[0].message.content == c.choices[1].message.content
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, n=17)
    assert e.value.body["param"] == "n"


def test_wire_payloads_validate_strictly_against_the_sdk_types(server) -> None:
    """Logprobs and several choices, aggregate and streamed, on Chat and Responses: every
    payload validates in pydantic strict mode against the openai SDK's models, with no field
    beyond the documented extensions."""
    base = server.base_url
    body = {
        "model": "tiny-agent", "messages": QUESTION, "max_tokens": 6, "temperature": 0.8,
        "seed": 3, "n": 2, "logprobs": True, "top_logprobs": 3, **NO_THINKING,
    }  # fmt: skip
    c = ChatCompletion.model_validate(post(base, "/v1/chat/completions", body).json(), strict=True)
    assert extra_fields(c) <= CHAT_EXTENSIONS and [ch.index for ch in c.choices] == [0, 1]
    assert all(len(ch.logprobs.content) > 0 for ch in c.choices)
    frames = sse_frames(base, "/v1/chat/completions", {**body, "stream": True})
    chunks = [
        ChatCompletionChunk.model_validate(json.loads(d), strict=True) for _, d in frames[:-1]
    ]
    assert all(extra_fields(ch) <= CHAT_EXTENSIONS for ch in chunks)
    streamed = {0: [], 1: []}
    for chunk in chunks:
        for ch in chunk.choices:
            streamed[ch.index] += ch.logprobs.content if ch.logprobs else []
    assert [[e.token for e in streamed[i]] for i in (0, 1)] == [
        [e.token for e in ch.logprobs.content] for ch in c.choices
    ]
    rbody = {
        "model": "tiny-agent", "input": "Hi!", "max_output_tokens": 6, "temperature": 0,
        "include": ["message.output_text.logprobs"], "top_logprobs": 2, "store": False,
        **NO_THINKING,
    }  # fmt: skip
    r = Response.model_validate(
        with_cache_writes(post(base, "/v1/responses", rbody).json()), strict=True
    )
    assert extra_fields(r) <= RESPONSE_EXTENSIONS and r.output[-1].content[0].logprobs
    for _, data in sse_frames(base, "/v1/responses", {**rbody, "stream": True}):
        ev = STREAM_EVENT.validate_python(with_cache_writes(json.loads(data)), strict=True)
        assert extra_fields(ev) <= RESPONSE_EXTENSIONS, ev.type


def running(server) -> float:
    for fam in text_string_to_metric_families(httpx.get(server.base_url + "/metrics").text):
        for s in fam.samples:
            if s.name == "ninfer_requests_running":
                return s.value
    raise KeyError("ninfer_requests_running")


def test_a_client_leaving_an_n_stream_cancels_every_choice(client, server) -> None:
    stream = client.chat.completions.create(
        model="tiny-agent", messages=QUESTION, max_tokens=400, temperature=1.0, n=3, stream=True,
        extra_body={"ignore_eos": True, **NO_THINKING},
    )  # fmt: skip
    seen: set[int] = set()
    for chunk in stream:
        seen |= {ch.index for ch in chunk.choices if ch.delta.content}
        if len(seen) == 3:
            break
    assert running(server) == 3  # every choice is generating
    stream.close()
    deadline = time.monotonic() + 20
    while running(server) > 0:
        assert time.monotonic() < deadline, "the choices kept running after the client left"
        time.sleep(0.05)


def test_one_lane_serves_n_choices_in_turn_and_bounds_n_by_capacity(server_factory) -> None:
    s = server_factory("--max-concurrency", "1", "--max-pending-requests", "1")
    one_lane = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0)
    kw: dict[str, Any] = {
        "model": "tiny-agent", "messages": QUESTION, "max_tokens": 6, "temperature": 1.0,
        "seed": SEED, "extra_body": NO_THINKING,
    }  # fmt: skip
    both = one_lane.chat.completions.create(n=2, **kw)
    alone = [one_lane.chat.completions.create(**{**kw, "seed": SEED + i}) for i in range(2)]
    assert [c.message.content for c in both.choices] == [
        a.choices[0].message.content for a in alone
    ]
    with pytest.raises(openai.BadRequestError) as e:
        one_lane.chat.completions.create(n=3, **kw)
    assert e.value.body["param"] == "n" and "--max-concurrency" in e.value.body["message"]

"""Engine-backed request observations end to end on the real `ninfer serve` with the trained tiny
agent: the thinking budget (--default-thinking-budget, Anthropic budget_tokens), the exact
admission split in Anthropic message_start, and Chat return_progress from committed prefill.

The prompts are the fixture's scripted ones, sent unchanged (the model memorised them).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from tokenizers import Tokenizer

from ninfer.api.service.reasoning import THINKING_BUDGET_GUIDANCE, thinking_budget_suffix_ids
from ninfer.artifact.format import Artifact
from tests.e2e.conftest import TINY_AGENT

PROMPTS = {
    p["name"]: p
    for p in json.loads((TINY_AGENT.parent / "tiny-agent.prompts.json").read_text())["prompts"]
}
BUDGET = 6  # --default-thinking-budget: far below every scripted reasoning
GUIDANCE = THINKING_BUDGET_GUIDANCE.rstrip("\n")  # the newline before </think> is formatting


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(
        "--max-concurrency", "2", "--max-context", "2048",
        "--default-thinking-budget", str(BUDGET), "--prefill-chunk", "16",
    )  # fmt: skip


@pytest.fixture(scope="module")
def suffix_len() -> int:
    tokenizer = Tokenizer.from_str(Artifact(TINY_AGENT).tokenizer_json)
    return len(thinking_budget_suffix_ids(tokenizer))


@pytest.fixture(scope="module")
def chat(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def chat_args(name: str, **kw) -> dict:
    p = PROMPTS[name]
    args = {
        "model": "tiny-agent",
        "messages": p["messages"],
        "temperature": 0,
        "max_tokens": 200,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": p["enable_thinking"]}},
    }
    if p["tools"]:
        args["tools"] = p["tools"]
    args.update(kw)
    return args


def reasoning_of(message) -> str:
    return message.model_extra.get("reasoning_content") or ""


# -- the thinking budget -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sum_think", "weather_paris"])
def test_default_budget_closes_thinking_with_the_guidance(chat, suffix_len, name):
    expected = PROMPTS[name]["expected"]["reasoning"]
    r = chat.chat.completions.create(**chat_args(name))
    reasoning = reasoning_of(r.choices[0].message)
    assert reasoning.endswith(GUIDANCE)
    head = reasoning[: -len(GUIDANCE)]
    assert head and expected.startswith(head)  # the model's own thinking, cut at the budget
    # the inserted tokens are output: budget + suffix, then at least one model token after it
    assert r.usage.completion_tokens >= BUDGET + suffix_len + 1
    assert r.usage.completion_tokens_details.reasoning_tokens >= BUDGET + suffix_len - 1
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")

    stream = chat.chat.completions.create(
        **chat_args(name), stream=True, stream_options={"include_usage": True}
    )
    deltas, content, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta
            if (d.model_extra or {}).get("reasoning_content"):
                deltas.append(d.model_extra["reasoning_content"])
            if d.content:
                content.append(d.content)
    assert "".join(deltas) == reasoning  # the guidance streams as reasoning deltas
    assert "".join(content) == (r.choices[0].message.content or "")
    assert usage.completion_tokens == r.usage.completion_tokens


def test_the_budget_leaves_non_thinking_requests_alone(chat):
    p = PROMPTS["capital"]  # enable_thinking false: no cap
    message = chat.chat.completions.create(**chat_args("capital")).choices[0].message
    assert message.content == p["expected"]["content"] and not reasoning_of(message)


def test_capacity_checks(chat, suffix_len):
    short = BUDGET + suffix_len  # passes the cap, no room for the suffix plus one token
    with pytest.raises(openai.BadRequestError) as e:
        chat.chat.completions.create(**chat_args("sum_think", max_tokens=short))
    assert e.value.body["code"] == "thinking_budget_capacity_insufficient"
    assert e.value.body["param"] == "max_tokens"
    ok = chat.chat.completions.create(**chat_args("sum_think", max_tokens=short + 1))
    assert reasoning_of(ok.choices[0].message).endswith(GUIDANCE)
    assert ok.usage.completion_tokens == short + 1  # the suffix and one model token
    # a capacity that ends at the cap never reaches it: the output limit wins, nothing inserted
    capped = chat.chat.completions.create(**chat_args("sum_think", max_tokens=BUDGET))
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == BUDGET
    assert GUIDANCE not in reasoning_of(capped.choices[0].message)
    zero = chat.chat.completions.create(**chat_args("sum_think", max_tokens=0))  # prompt only
    assert zero.usage.completion_tokens == 0


def test_responses_capacity_error_names_max_output_tokens(chat, suffix_len):
    p = PROMPTS["sum_think"]
    with pytest.raises(openai.BadRequestError) as e:
        chat.responses.create(
            model="tiny-agent",
            input=p["messages"],
            max_output_tokens=BUDGET + suffix_len,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
    assert e.value.body["code"] == "thinking_budget_capacity_insufficient"
    assert e.value.body["param"] == "max_output_tokens"


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=120
    )


def test_anthropic_budget_tokens_overrides_the_default(server, suffix_len):
    c = anthropic_client(server)
    p = PROMPTS["sum_think"]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    # 1024 replaces the server's 6: the scripted reasoning (far shorter) ends naturally
    m = c.messages.create(
        model="m",
        max_tokens=2000,
        messages=p["messages"],
        thinking=thinking,
        extra_body={"temperature": 0.0},
    )
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == p["expected"]["reasoning"]
    assert m.content[1].text == p["expected"]["content"]
    # and the engine gets that budget: a capacity just past 1024 cannot hold the suffix
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model="m", max_tokens=1024 + suffix_len, messages=p["messages"], thinking=thinking
        )
    assert e.value.body["error"]["details"]["error_code"] == "thinking_budget_capacity_insufficient"


# -- exact admission split and prompt progress ---------------------------------------------------


def test_anthropic_message_start_carries_the_exact_cache_split(server):
    c = anthropic_client(server)
    p = PROMPTS["weather_berlin"]  # a long tool prompt, thinking disabled
    tools = [
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]}
        for t in p["tools"]
    ]  # fmt: skip
    args = {"model": "m", "max_tokens": 64, "messages": p["messages"], "tools": tools,
            "thinking": {"type": "disabled"}, "extra_body": {"temperature": 0.0}}  # fmt: skip
    splits = []
    for _ in range(2):
        start = delta = None
        for event in c.messages.create(**args, stream=True):
            if event.type == "message_start":
                start = event.message.usage
            elif event.type == "message_delta":
                delta = event.usage
        assert start.input_tokens == delta.input_tokens
        assert start.cache_read_input_tokens == delta.cache_read_input_tokens
        assert start.output_tokens == 0 < delta.output_tokens
        splits.append((start.input_tokens, start.cache_read_input_tokens))
    (fresh, shared), (rest, cached) = splits  # the first may share the tool preamble already
    assert cached > shared and rest + cached == fresh + shared  # the repeat reuses its prompt


def progress_chunks(server, body: dict) -> tuple[list[dict], int]:
    """(prompt_progress objects, index of the first chunk with an output delta among chunks)."""
    chunks = []
    with httpx.stream(
        "POST", server.base_url + "/v1/chat/completions", json=body, timeout=120
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    progress = [(i, c["prompt_progress"]) for i, c in enumerate(chunks) if "prompt_progress" in c]
    first_delta = next(
        i for i, c in enumerate(chunks)
        if c["choices"] and any(c["choices"][0]["delta"].get(k) for k in ("content", "reasoning_content", "tool_calls"))
    )  # fmt: skip
    assert max(i for i, _ in progress) < first_delta  # progress ends before any output
    return [q for _, q in progress], chunks


def test_return_progress_starts_at_the_cached_prefix(server):
    p = PROMPTS["add_plain"]  # a long tool prompt, thinking disabled
    body = {"model": "tiny-agent", "messages": p["messages"], "tools": p["tools"], "max_tokens": 8,
            "temperature": 0, "stream": True, "return_progress": True,
            "chat_template_kwargs": {"enable_thinking": p["enable_thinking"]}}  # fmt: skip
    caches = []
    for _ in range(2):
        progress, chunks = progress_chunks(server, body)
        first, last = progress[0], progress[-1]
        assert first["processed"] == first["cache"] and last["processed"] == last["total"]
        assert {(q["total"], q["cache"]) for q in progress} == {(first["total"], first["cache"])}
        done = [q["processed"] for q in progress]
        assert done == sorted(done) and [q["time_ms"] for q in progress] == sorted(
            q["time_ms"] for q in progress
        )
        # every later event is a committed 16-token prefill chunk (or the prompt's end)
        assert all((q - first["cache"]) % 16 == 0 or q == last["total"] for q in done[1:])
        timings = chunks[-1]["timings"]
        assert (
            timings["cache_n"] == first["cache"]
            and timings["cache_n"] + timings["prompt_n"] == last["total"]
        )
        caches.append(first["cache"])
    assert caches[1] > max(caches[0], 0)  # the repeat starts at the prefix the first one left

"""Chat Completions against the real `ninfer serve`, driven by the official `openai` client.

The trained tiny agent (artifacts/fixtures/tiny-agent.ninfer) gives deterministic reasoning and
tool calls; the server runs on CPU in float32 exactly as users start it.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import TINY_AGENT

PROMPTS = json.loads((TINY_AGENT.parent / "tiny-agent.prompts.json").read_text())["prompts"]


def by_name(name: str) -> dict:
    return next(p for p in PROMPTS if p["name"] == name)


def first_with(pred) -> dict:
    return next(p for p in PROMPTS if pred(p))


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0)


def create(client, p, **kw):
    extra = {"chat_template_kwargs": {"enable_thinking": p["enable_thinking"]}}
    args = {
        "model": "tiny-agent",
        "messages": p["messages"],
        "temperature": 0,
        "max_tokens": 200,
        "extra_body": extra,
    }
    if p["tools"]:
        args["tools"] = p["tools"]
    args.update(kw)
    return client.chat.completions.create(**args)


def collect_stream(stream):
    text, reasoning, finishes, usage, chunks = [], [], [], [], []
    calls: dict[int, dict] = {}
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for choice in chunk.choices:
            d = choice.delta
            if d.content:
                text.append(d.content)
            r = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get(
                "reasoning_content"
            )
            if r:
                reasoning.append(r)
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    c["id"] = tc.id
                if tc.function and tc.function.name:
                    c["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    c["arguments"] += tc.function.arguments
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    return {
        "text": "".join(text),
        "reasoning": "".join(reasoning),
        "finishes": finishes,
        "usage": usage,
        "calls": [calls[i] for i in sorted(calls)],
        "chunks": chunks,
    }


def test_models_lists_the_artifact_name(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-agent"]
    assert client.models.retrieve("tiny-agent").id == "tiny-agent"


@pytest.mark.parametrize("name", ["hello", "greetings"])
def test_stream_equals_aggregate_at_temperature_zero(client, name):
    p = by_name(name)
    full = create(client, p)
    msg = full.choices[0].message
    assert msg.content == p["expected"]["content"]
    assert full.choices[0].finish_reason == "stop"
    got = collect_stream(create(client, p, stream=True))
    assert got["text"] == msg.content
    assert got["finishes"] == ["stop"]
    assert got["usage"] == []  # no usage chunk unless asked
    assert "\ufffd" not in got["text"]
    timings = full.model_extra["timings"]
    assert timings["cache_n"] + timings["prompt_n"] == full.usage.prompt_tokens
    assert timings["predicted_n"] == full.usage.completion_tokens


def test_usage_chunk_only_when_asked(client):
    p = by_name("capital")
    got = collect_stream(create(client, p, stream=True, stream_options={"include_usage": True}))
    assert len(got["usage"]) == 1 and got["finishes"] == ["stop"]
    last = got["chunks"][-1]
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert "timings" in last.model_extra  # timings ride on the last JSON chunk
    assert last.usage.prompt_tokens_details.cached_tokens >= 0
    assert last.usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_and_answer_are_split(client):
    p = first_with(
        lambda p: (
            p["expected"]["reasoning"]
            and p["expected"]["content"]
            and not p["expected"]["tool_calls"]
        )
    )
    full = create(client, p)
    msg = full.choices[0].message
    reasoning = msg.model_extra.get("reasoning_content")
    assert reasoning.strip() == p["expected"]["reasoning"].strip()
    assert msg.content.strip() == p["expected"]["content"].strip()
    assert "<think>" not in msg.content and "</think>" not in msg.content
    assert full.usage.completion_tokens_details.reasoning_tokens > 0
    got = collect_stream(create(client, p, stream=True))
    assert got["reasoning"] == reasoning and got["text"] == msg.content


def test_streamed_tool_call_equals_aggregate(client):
    p = first_with(lambda p: len(p["expected"]["tool_calls"]) >= 1)
    full = create(client, p)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (c["name"], c["arguments"]) for c in p["expected"]["tool_calls"]
    ]
    got = collect_stream(create(client, p, stream=True))
    assert got["finishes"] == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert all(c["id"] and c["id"].startswith("call_") for c in got["calls"])


def test_two_tool_calls_in_one_turn(client):
    p = first_with(lambda p: len(p["expected"]["tool_calls"]) >= 2)
    calls = create(client, p).choices[0].message.tool_calls
    assert len(calls) == len(p["expected"]["tool_calls"])
    assert len({c.id for c in calls}) == len(calls)


def test_tool_choice_none_leaves_markup_as_text(client):
    p = first_with(lambda p: len(p["expected"]["tool_calls"]) == 1)
    msg = create(client, p, tool_choice="none").choices[0].message
    assert not msg.tool_calls


def test_allowed_tools_limit_which_calls_are_structured(client):
    p = by_name("alarm_and_weather")  # calls set_alarm, then get_weather
    names = [t["function"]["name"] for t in p["tools"]]
    full = create(client, p)
    assert [c.function.name for c in full.choices[0].message.tool_calls] == names

    def allow(*allowed):
        tools = [{"type": "function", "function": {"name": n}} for n in allowed]
        return {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": tools}}

    assert create(client, p, tool_choice=allow(*reversed(names))).choices[0].message.tool_calls
    # every declared tool is still in the prompt, so the model writes the same markup; a call
    # of a tool outside the allowed set returns the whole region to text
    only = create(client, p, tool_choice=allow("set_alarm"))
    choice = only.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert "<tool_call>" in choice.message.content and "get_weather" in choice.message.content
    got = collect_stream(create(client, p, tool_choice=allow("set_alarm"), stream=True))
    assert got["calls"] == [] and got["text"] == choice.message.content


def test_seed_makes_sampling_reproducible(client):
    p = {**by_name("sum_think"), "messages": [{"role": "user", "content": "Hi!"}]}  # uncertain
    runs = [
        create(client, p, temperature=1.0, seed=seed, max_tokens=12).choices[0].message
        for seed in (-7, -7, 8)
    ]
    texts = [(m.content, m.model_extra.get("reasoning_content")) for m in runs]
    assert texts[0] == texts[1] and texts[0] != texts[2]


def test_stop_string(client):
    p = by_name("capital")  # "The capital of France is Paris."
    full = create(client, p, stop=["France"])
    assert full.choices[0].message.content == "The capital of "
    assert full.choices[0].finish_reason == "stop"
    got = collect_stream(create(client, p, stop=["France"], stream=True))
    assert got["text"] == "The capital of "


def test_max_tokens_finishes_with_length(client):
    p = by_name("capital")
    full = create(client, p, max_tokens=3)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 3
    newer = create(client, p, max_tokens=50, max_completion_tokens=2)  # the newer spelling wins
    assert newer.choices[0].finish_reason == "length" and newer.usage.completion_tokens == 2
    zero = create(client, p, max_tokens=0)
    assert zero.usage.completion_tokens == 0 and zero.choices[0].finish_reason == "length"


def test_cached_tokens_on_a_repeated_long_prompt(client):
    p = by_name("capital")
    long_system = {"role": "system", "content": "You are a helpful assistant. " * 40}
    msgs = [long_system, *p["messages"]]
    create(client, p, messages=msgs, max_tokens=4)
    again = create(client, p, messages=msgs, max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert (
        again.model_extra["timings"]["cache_n"] == again.usage.prompt_tokens_details.cached_tokens
    )


def test_rejections_name_the_field(client):
    p = by_name("hello")
    unsupported, invalid = "unsupported_value", "invalid_value"
    cases = [
        ({"n": 17}, "n", invalid),
        ({"logit_bias": {"5": 3}}, "logit_bias.5", unsupported),
        ({"top_logprobs": 3}, "top_logprobs", invalid),  # without logprobs: true
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, "response_format.json_schema.schema.type", "invalid_schema"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": by_name("weather_paris")["tools"]}, "tool_choice.function.name", invalid),
        ({"extra_body": {"guided_choice": []}}, "guided_choice", invalid),
        ({"extra_body": {"json_schema": "object"}}, "json_schema", "invalid_type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", invalid),
        ({"temperature": -1}, "temperature", invalid),
        ({"max_completion_tokens": -1}, "max_completion_tokens", invalid),
    ]  # fmt: skip
    for kw, param, code in cases:
        with pytest.raises(openai.BadRequestError) as e:
            create(client, p, **kw)
        assert (e.value.status_code, e.value.param, e.value.code) == (400, param, code), kw
        assert e.value.type == "invalid_request_error" and param in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        create(client, p, model="gpt-4o")
    assert e.value.body["code"] == "model_not_found"
    # neutral values are accepted
    ok = create(
        client,
        p,
        logprobs=False,
        top_logprobs=0,
        logit_bias={"5": 0},
        extra_body={"unknown_field": 1, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert ok.choices[0].message.content


def test_context_length_exceeded_reports_counts(client):
    p = by_name("hello")
    huge = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as e:
        create(client, p, messages=huge)
    assert e.value.body["code"] == "context_length_exceeded"
    assert "2048" in e.value.body["message"]


def test_request_id_on_every_response(live_server):
    r = httpx.post(
        live_server.base_url + "/v1/chat/completions", json={"model": "nope", "messages": []}
    )
    assert r.status_code in (400, 404) and r.headers["x-request-id"]
    r1 = httpx.get(live_server.base_url + "/v1/models")
    r2 = httpx.get(live_server.base_url + "/v1/models")
    assert r1.headers["x-request-id"] != r2.headers["x-request-id"]


def _stream_lines(base_url, body, out, stop_after=None, headers=None):
    with httpx.stream(
        "POST", base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append((time.monotonic(), line[6:]))
                if stop_after is not None and len(out) >= stop_after:
                    return


LONG = {
    "model": "tiny-agent",
    "messages": [{"role": "user", "content": "Hi!"}],
    "max_tokens": 400,
    "temperature": 1.0,
    "seed": 7,
    "stream": True,
    "ignore_eos": True,
}


def test_concurrent_streams_interleave(live_server):
    a, b = [], []
    ta = threading.Thread(target=_stream_lines, args=(live_server.base_url, dict(LONG, seed=1), a))
    tb = threading.Thread(target=_stream_lines, args=(live_server.base_url, dict(LONG, seed=2), b))
    ta.start()
    tb.start()
    ta.join(120)
    tb.join(120)
    assert a and b
    # neither waited for the other: each stream's first chunk came before the other's last one
    assert a[1][0] < b[-1][0] and b[1][0] < a[-1][0]


def test_dropped_client_frees_its_lane(server_factory):
    s = server_factory("--max-concurrency", "1", "--max-pending-requests", "4")
    got = []
    _stream_lines(s.base_url, dict(LONG, max_tokens=1800), got, stop_after=3)  # then hang up
    t0 = time.monotonic()
    r = httpx.post(
        s.base_url + "/v1/chat/completions",
        json={**LONG, "stream": False, "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200
    assert time.monotonic() - t0 < 10
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = httpx.get(s.base_url + "/health")
        if m.status_code == 200:
            break
    assert m.status_code == 200


def test_overload_and_queue_timeout(server_factory):
    s = server_factory(
        "--max-concurrency", "1", "--max-pending-requests", "1", "--pending-timeout-ms", "300"
    )
    c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
    hold = []
    t = threading.Thread(target=_stream_lines, args=(s.base_url, dict(LONG, max_tokens=600), hold))
    t.start()
    while not hold:
        time.sleep(0.01)
    # the lane is busy: one request may wait (and times out), the next one is refused
    results = {}

    def waiting():
        try:
            c.chat.completions.create(
                model="tiny-agent", messages=[{"role": "user", "content": "Hi!"}], max_tokens=2
            )
            results["w"] = "ok"
        except openai.APIStatusError as e:
            results["w"] = (e.status_code, e.body.get("code"))

    w = threading.Thread(target=waiting)
    w.start()
    time.sleep(0.1)
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(
            model="tiny-agent", messages=[{"role": "user", "content": "Hi!"}], max_tokens=2
        )
    assert e.value.status_code == 429 and e.value.body["code"] == "server_overloaded"
    w.join(30)
    assert results["w"] == (503, "request_queue_timeout")
    t.join(120)


def test_auth_cors_and_body_limit(server_factory):
    s = server_factory("--cors", "--max-request-mib", "1", api_key="sekret")
    bad = openai.OpenAI(base_url=s.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=s.base_url + "/v1", api_key="sekret", max_retries=0)
    assert good.models.list().data[0].id == "tiny-agent"
    assert httpx.get(s.base_url + "/health").status_code == 200  # unauthenticated
    pre = httpx.options(
        s.base_url + "/v1/chat/completions",
        headers={"Origin": "http://x.example", "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code in (200, 204) and pre.headers.get("access-control-allow-origin")
    big = "x" * (2 * 1024 * 1024)
    with pytest.raises(openai.APIStatusError) as e:
        good.chat.completions.create(
            model="tiny-agent", messages=[{"role": "user", "content": big}]
        )
    assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"


def test_timings_per_token_and_return_progress(live_server):
    p = by_name("capital")
    body = {
        "model": "tiny-agent",
        "messages": p["messages"],
        "max_tokens": 50,
        "temperature": 0,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
        "chat_template_kwargs": {"enable_thinking": p["enable_thinking"]},
    }
    lines = []
    _stream_lines(live_server.base_url, body, lines)
    chunks = [json.loads(x) for _, x in lines if x != "[DONE]"]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress[0]["processed"] == progress[0]["cache"]
    assert progress[-1]["processed"] == progress[-1]["total"]
    assert [q["processed"] for q in progress] == sorted(q["processed"] for q in progress)
    first_delta = next(
        i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")
    )
    assert max(i for i, c in enumerate(chunks) if "prompt_progress" in c) < first_delta
    visible = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    counts = [c["timings"]["predicted_n"] for c in visible]
    assert counts == sorted(counts) and counts[-1] > 0
    assert "timings" in chunks[-1]  # terminal timings always
    # the snapshots measure on the engine's clock, as the terminal timings do: prompt time is
    # fixed once the first token committed (not before the last prefill progress), and
    # generation time grows with the committed count up to the terminal figure
    final = chunks[-1]["timings"]
    snaps = [c["timings"] for c in visible]
    assert {t["prompt_ms"] for t in snaps} == {final["prompt_ms"]}
    assert final["prompt_ms"] >= progress[-1]["time_ms"] - 1
    spans = [(t["predicted_n"], t["predicted_ms"]) for t in snaps]
    assert spans == sorted(spans) and spans[-1][1] <= final["predicted_ms"]
    # tokens the engine committed in one event (a busy consumer gets them coalesced) share that
    # event's snapshot time; a later event's time is later
    times = {n: ms for n, ms in spans}
    assert sorted(times.values()) == list(times.values())


def _generated_tokens(base_url: str) -> tuple[float, float]:
    """(ninfer_generation_tokens_total, ninfer_requests_running) from /metrics."""
    values = {}
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("ninfer_generation_tokens_total", "ninfer_requests_running"):
            values[name] = float(value)
    return values["ninfer_generation_tokens_total"], values["ninfer_requests_running"]


def test_a_dropped_aggregate_request_is_cancelled(live_server):
    """A non-streamed request whose client hangs up stops in the engine at once instead of
    generating its remaining tokens (ignore_eos keeps it from ending early)."""
    base = live_server.base_url
    before, _ = _generated_tokens(base)
    body = {**LONG, "stream": False, "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(base + "/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    deadline = time.monotonic() + 3
    while (state := _generated_tokens(base))[1] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    generated, running = state
    assert running == 0
    time.sleep(0.3)  # nothing more is generated for it afterwards
    assert _generated_tokens(base)[0] == generated
    assert 0 < generated - before < 1500


def test_constrained_output_on_the_tiny_agent(client):
    """Refusals ninfer lifts (docs/serving.md, Constrained output): a JSON schema response is
    valid and complete; tool_choice required turns a chit-chat prompt into a valid call; a named tool is
    the one called."""
    p = by_name("hello")
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 20}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    r = create(client, p, response_format=fmt, max_tokens=60)
    assert r.choices[0].finish_reason == "stop"
    assert len(json.loads(r.choices[0].message.content)["answer"]) <= 20
    # thinking on: the reasoning is free, the answer after </think> follows the schema
    thinking = by_name("sum_think")
    r = create(client, thinking, response_format=fmt, max_tokens=120)
    assert r.choices[0].message.model_extra.get("reasoning_content")
    assert r.choices[0].finish_reason == "stop"
    assert len(json.loads(r.choices[0].message.content)["answer"]) <= 20
    tools = by_name("weather_paris")["tools"]
    forced = create(client, p, tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert forced.choices[0].finish_reason == "tool_calls"
    (call,) = forced.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    weather = by_name("weather_paris")
    named = create(
        client, weather, tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_weather"]

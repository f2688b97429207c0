"""Fuzzing every POST endpoint through the real app and engine (tiny trained model, context 64
so that any accepted body finishes in a few tokens): no body gets a 5xx, and every refusal is
an error in the protocol's shape that names the field at fault (or is one of the body-level
codes, which concern no single field). Hypothesis runs derandomized: the same 1,500 bodies on
every run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.live_app import app_client

MODEL = "tiny-agent"
USER = [{"role": "user", "content": "hi"}]
BASE: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": USER, "max_tokens": 2},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2},
    "/v1/responses/input_tokens": {"model": MODEL, "input": "hi"},
    "/v1/messages": {"model": MODEL, "messages": USER, "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": USER},
    "/v1/responses/compact": {"model": MODEL, "input": "hi"},
}
# Fields each protocol reads, so mutations mostly hit validation rather than unknown fields.
FIELDS = [
    "model", "messages", "input", "max_tokens", "max_output_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_sequences", "stream",
    "stream_options", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort",
    "reasoning", "thinking", "system", "instructions", "response_format", "text", "n",
    "logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "metadata", "store",
    "previous_response_id", "include", "parallel_tool_calls", "enable_thinking", "ignore_eos",
    "return_progress", "timings_per_token", "modalities", "user", "prompt_cache_key",
]  # fmt: skip
# Errors about the body as a whole: no single field to name.
BODY_LEVEL_CODES = {
    "invalid_json", "request_too_complex", "unsupported_media_type", "compaction_not_supported",
    "invalid_prompt", "context_length_exceeded", "request_too_large",
}  # fmt: skip
# x 6 endpoints = 1,500 bodies (CI time: 350 per endpoint took 25 s of the suite's budget)
EXAMPLES_PER_ENDPOINT = 250

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", "user", "assistant", "tool", "system", "text", "auto", "none", MODEL]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from([*FIELDS, "role", "content", "type", "text"]), inner,
                        max_size=4),
    ),
    max_leaves=12,
)  # fmt: skip
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])},
        optional={"content": json_values, "tool_calls": json_values, "tool_call_id": scalars,
                  "name": scalars},
    ),
    max_size=3,
)  # fmt: skip
# Raw-JSON members json.dumps would not write: huge numbers, surrogates, deep nesting.
raw_members = st.sampled_from([
    "1" + "0" * 400, "-" + "9" * 4000, "1e400", "[" * 200 + "]" * 200,
    '{"a":' * 80 + "1" + "}" * 80, '"\\ud800"', '"a\udc00b"', '"\\u0000"',
])  # fmt: skip


RAW_TARGETS = [
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "max_tokens",
    "max_output_tokens", "seed", "top_k", "chat_template_kwargs", "metadata", "messages", "input",
    "stop", "tools",
]  # fmt: skip


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    body = dict(BASE[path])
    for _ in range(draw(st.integers(0, 3))):
        body[draw(st.sampled_from(FIELDS))] = draw(json_values)
    if draw(st.booleans()):
        key = "input" if "responses" in path else "messages"
        body[key] = draw(messages)
    if body.get("stream") is True:
        body["stream"] = draw(st.booleans())
    raw = json.dumps(body).encode()
    # (hypothesis favours the bounds of a range: the triggers below are inner values)
    if draw(st.integers(0, 3)) == 2:  # a member holding raw JSON text
        member = draw(st.sampled_from(RAW_TARGETS))
        text = draw(raw_members).encode("utf-8", "surrogatepass")
        raw = raw[:-1] + b', "' + member.encode() + b'": ' + text + b"}"
    if draw(st.integers(0, 19)) == 7:  # not JSON at all
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


@pytest.fixture(scope="module")
def client(tiny_agent):
    with app_client(tiny_agent, max_context=64, default_max_tokens=2) as c:
        c.headers["content-type"] = "application/json"
        yield c


def check(r: Any, path: str) -> None:
    assert r.status_code < 500, f"{r.status_code} for {path}: {r.text[:500]}"
    if r.status_code < 400:
        return
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        pytest.fail(f"{path}: an error status with a stream body")
    body = r.json()
    if path.startswith("/v1/messages"):  # Anthropic: {"type":"error","error":{...},"request_id"}
        assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}
        details = body["error"].get("details", {})
        code, param = details.get("error_code"), details.get("param")
    else:  # OpenAI: {"error":{"message","type","param","code"}}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        code, param = body["error"]["code"], body["error"]["param"]
    assert isinstance(code, str) and code
    assert param or code in BODY_LEVEL_CODES, f"{path}: {code} names no field: {body}"


@pytest.mark.parametrize("path", list(BASE))
def test_no_body_gets_a_5xx_and_every_refusal_names_its_field(client, path):
    seen = {"n": 0}

    @settings(
        max_examples=EXAMPLES_PER_ENDPOINT,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(raw=bodies(path))
    def run(raw: bytes) -> None:
        seen["n"] += 1
        check(client.post(path, content=raw), path)

    run()
    assert seen["n"] >= EXAMPLES_PER_ENDPOINT

"""Anthropic Messages generation end to end: the real `ninfer serve` on the trained tiny agent, driven by
the official `anthropic` client (and raw HTTP where the client cannot express a request).

Expected outputs come from the fixture's scripted prompts (greedy decoding reproduces them).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

GREEDY = {"temperature": 0.0}
SIGNATURE_FROM_ELSEWHERE = "EqQBCkYIBxgCKkD-not-a-ninfer-signature"
HI_MESSAGES = [{"role": "user", "content": "Hi!"}]


# -- helpers --------------------------------------------------------------------------------------


def client(server, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("api_key", "unused")
    return anthropic.Anthropic(base_url=server.base_url, max_retries=0, timeout=120, **kw)


def prompt(prompts: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(p for p in prompts if p["name"] == name)


def tools_of(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in p["tools"]
    ]


def to_anthropic(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """OpenAI-form scripted history -> (system, Anthropic messages)."""
    system = None
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("reasoning_content"):
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": m["reasoning_content"],
                        "signature": SIGNATURE_FROM_ELSEWHERE,
                    }
                )
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for c in m.get("tool_calls", []):
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "input": c["function"]["arguments"],
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        else:  # tool result: a user turn of tool_result blocks (consecutive ones are joined)
            out.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": m["tool_call_id"],
                            "content": m["content"],
                        }
                    ],
                }
            )
    return system, out


def request_of(p: dict[str, Any], **extra: Any) -> dict[str, Any]:
    system, messages = to_anthropic(p["messages"])
    req: dict[str, Any] = {
        "model": "claude-local-proxy",
        "max_tokens": 256,
        "messages": messages,
        "extra_body": dict(GREEDY),
    }
    if system is not None:
        req["system"] = system
    if p["tools"]:
        req["tools"] = tools_of(p)
    if p["enable_thinking"]:
        req["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        req["max_tokens"] = 2048
    else:
        req["thinking"] = {"type": "disabled"}
    req.update(extra)
    return req


def blocks(message: Any) -> list[dict[str, Any]]:
    """Content blocks as dicts, tool-use ids dropped (they are fresh per response)."""
    out = []
    for b in message.content:
        d = b.model_dump(exclude_none=True)
        d.pop("id", None)
        out.append(d)
    return out


def text_of(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def post(
    server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=headers or {}, timeout=120)


# -- generation -----------------------------------------------------------------------------------


def test_models_read_whole_through_the_anthropic_client(live_server):
    """GET /v1/models and /v1/models/{id} carry Anthropic's model fields beside OpenAI's."""
    c = client(live_server)
    page = c.models.list()
    (info,) = page.data
    assert (info.id, info.type, info.display_name) == ("tiny-agent", "model", "tiny-agent")
    assert info.created_at.tzinfo is not None and page.has_more is False
    assert page.first_id == page.last_id == "tiny-agent"
    assert c.models.retrieve("tiny-agent") == info


def test_aggregate_and_stream_agree(live_server, tiny_agent_prompts):
    c = client(live_server)
    p = prompt(tiny_agent_prompts, "hello")
    raw = c.messages.with_raw_response.create(**request_of(p))
    assert raw.headers["request-id"].startswith("req_")
    message = raw.parse()
    assert message.model == "claude-local-proxy"  # the label is echoed
    assert message.role == "assistant" and message.type == "message"
    assert text_of(message) == p["expected"]["content"]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens > 0

    with c.messages.stream(**request_of(p)) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == text_of(message)
    assert blocks(final) == blocks(message)
    assert final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens
    prompt_total = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == prompt_total


def test_count_tokens_equals_usage_input_tokens(live_server, tiny_agent_prompts):
    c = client(live_server)
    p = prompt(tiny_agent_prompts, "tomato")
    req = request_of(p)
    counted = c.messages.count_tokens(
        model=req["model"], messages=req["messages"], thinking=req["thinking"]
    ).input_tokens
    message = c.messages.create(**req)
    cached = message.usage.cache_read_input_tokens or 0
    assert counted == message.usage.input_tokens + cached
    if cached == 0:
        assert counted == message.usage.input_tokens
    # sampling and output fields do not change the count; tools do
    other = post(
        live_server,
        "/v1/messages/count_tokens",
        {
            **{k: v for k, v in req.items() if k != "extra_body"},
            "max_tokens": 7,
            "temperature": 0.3,
            "stop_sequences": ["x"],
        },
    )
    assert other.status_code == 200 and other.json() == {"input_tokens": counted}
    with_tools = c.messages.count_tokens(
        model="m",
        messages=req["messages"],
        thinking=req["thinking"],
        tools=tools_of(prompt(tiny_agent_prompts, "weather_paris")),
    )
    assert with_tools.input_tokens > counted


def test_billing_header_block_is_not_counted(live_server):
    c = client(live_server)
    msgs = [{"role": "user", "content": "Hi!"}]
    plain = c.messages.count_tokens(
        model="m", messages=msgs, system=[{"type": "text", "text": "Be kind."}]
    )
    billed = c.messages.count_tokens(
        model="m",
        messages=msgs,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=1"},
            {"type": "text", "text": "Be kind."},
        ],
    )
    assert billed.input_tokens == plain.input_tokens


def test_assistant_prefill_is_continued(live_server, tiny_agent_prompts):
    c = client(live_server)
    p = prompt(tiny_agent_prompts, "capital")
    prefix = "The capital of France"
    req = request_of(p)
    req["messages"] = [*req["messages"], {"role": "assistant", "content": prefix}]
    message = c.messages.create(**req)
    assert prefix + text_of(message) == p["expected"]["content"]
    assert message.stop_reason == "end_turn"


def test_enabled_thinking_aggregate_and_stream(live_server, tiny_agent_prompts):
    c = client(live_server)
    p = prompt(tiny_agent_prompts, "sum_think")
    message = c.messages.create(**request_of(p))
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking == p["expected"]["reasoning"]
    assert thinking.signature
    assert text.type == "text" and text.text == p["expected"]["content"]

    kinds: list[str] = []
    with c.messages.stream(**request_of(p)) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert blocks(final) == blocks(message)
    assert "thinking" in kinds and "signature" in kinds and "text" in kinds
    assert kinds.index("signature") < kinds.index("text")
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def test_tool_use_round_trip(live_server, tiny_agent_prompts):
    c = client(live_server)
    first = prompt(tiny_agent_prompts, "weather_paris")
    message = c.messages.create(**request_of(first))
    assert message.stop_reason == "tool_use"
    (thinking, call) = message.content
    assert thinking.thinking == first["expected"]["reasoning"]
    (expected_call,) = first["expected"]["tool_calls"]
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert (call.name, call.input) == (expected_call["name"], expected_call["arguments"])

    with c.messages.stream(**request_of(first)) as stream:
        final = stream.get_final_message()
    assert blocks(final) == blocks(message) and final.stop_reason == "tool_use"

    # Send the response back with the tool's result: the model answers from it.
    follow = prompt(tiny_agent_prompts, "weather_paris_result")
    tool_result = next(m for m in follow["messages"] if m["role"] == "tool")["content"]
    req = request_of(follow)
    req["messages"] = [
        req["messages"][0],
        {
            "role": "assistant",
            "content": [b.model_dump(exclude_none=True) for b in message.content],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": tool_result}],
        },
    ]
    answer = c.messages.create(**req)
    assert answer.stop_reason == "end_turn"
    assert [b.type for b in answer.content] == ["thinking", "text"]
    assert answer.content[0].thinking == follow["expected"]["reasoning"]
    assert text_of(answer) == follow["expected"]["content"]


def test_stop_sequence(live_server, tiny_agent_prompts):
    c = client(live_server)
    p = prompt(tiny_agent_prompts, "capital")
    others = [
        f"never-{i}" for i in range(6)
    ]  # more than Chat's four: the Messages API sets no limit
    message = c.messages.create(**request_of(p, stop_sequences=[*others, "Paris", "Rome"]))
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "Paris"
    assert text_of(message) == p["expected"]["content"].split("Paris")[0]
    with c.messages.stream(**request_of(p, stop_sequences=["Paris"])) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == (
        "stop_sequence",
        "Paris",
        text_of(message),
    )


def test_max_tokens_and_its_default(live_server, tiny_agent_prompts):
    c = client(live_server)
    p = prompt(tiny_agent_prompts, "hello")
    message = c.messages.create(**request_of(p, max_tokens=3))
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi!"}],
        "thinking": {"type": "disabled"},
        **GREEDY,
    }
    r = post(live_server, "/v1/messages", body)  # max_tokens omitted: --default-max-tokens
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "end_turn"


def test_context_exhaustion(live_server):
    """A prompt that leaves two tokens of the 2048-token context: generation stops at the
    context ceiling with model_context_window_exceeded."""
    c = client(live_server)

    def count(text: str) -> int:
        return c.messages.count_tokens(
            model="m",
            messages=[{"role": "user", "content": text}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        ).input_tokens

    unit = " tomato"
    base, ten = count(unit), count(unit * 11)  # (empty content is refused)
    n = (2046 - base) * 10 // (ten - base) + 1
    text = unit * n
    while count(text) > 2046:
        text = text[: -len(unit)]
    while count(text + " a") <= 2046:
        text += " a"
    assert 2040 <= count(text) <= 2046
    message = c.messages.create(
        model="m",
        max_tokens=4096,
        messages=[{"role": "user", "content": text}],
        extra_body=dict(GREEDY),
    )
    assert message.stop_reason == "model_context_window_exceeded"
    assert message.usage.output_tokens <= 8


# -- wire shapes, validated against the official client's own types ------------------------------


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, JSON data) of every SSE frame; comments (keep-alives) are skipped."""
    out = []
    for frame in text.split("\n\n"):
        lines = [ln for ln in frame.split("\n") if ln and not ln.startswith(":")]
        if lines:
            assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
            out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def test_wire_shapes_validate_as_the_official_types(live_server, tiny_agent_prompts):
    """Aggregate messages, every SSE event, token counts and error bodies pass the official
    client's strict (pydantic) validation, not only its lenient parsing."""
    events = TypeAdapter(RawMessageStreamEvent)
    for name in ("hello", "sum_think", "weather_two", "search_recipes"):
        req = request_of(prompt(tiny_agent_prompts, name))
        body = {**{k: v for k, v in req.items() if k != "extra_body"}, **GREEDY}
        message = Message.model_validate(post(live_server, "/v1/messages", body).json())
        assert message.stop_reason is not None
        streamed = sse_events(post(live_server, "/v1/messages", {**body, "stream": True}).text)
        assert streamed[0][0] == "message_start" and streamed[-1][0] == "message_stop"
        for event, data in streamed:
            assert data["type"] == event
            if event != "ping":
                events.validate_python(data)
    count = post(live_server, "/v1/messages/count_tokens", {"model": "m", "messages": HI_MESSAGES})
    MessageTokensCount.model_validate(count.json())
    bad = post(live_server, "/v1/messages", {"model": "m", "messages": []})
    error = ErrorResponse.model_validate(bad.json())
    assert error.error.type == "invalid_request_error"
    assert error.request_id == bad.headers["request-id"]

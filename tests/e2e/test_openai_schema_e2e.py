"""Wire payloads of `ninfer serve` validated strictly against the official `openai` SDK types.

The SDK's own client parses leniently (`construct`): a missing or mistyped field goes
unnoticed until a caller touches it. Here every aggregate body, every Chat chunk and every
Responses SSE event is validated with pydantic strict mode against the SDK's models
(`ChatCompletion`, `ChatCompletionChunk`, `Response`, the `ResponseStreamEvent` union,
`ResponseItemList`, `ErrorObject`), fields outside the SDK schema are limited to the documented
extensions, and the stream grammar (ids, indices, sequence numbers, event order, deltas that
concatenate to the terminal values) is checked on the raw SSE frames.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from openai.types.shared import ErrorObject
from pydantic import BaseModel, TypeAdapter

from tests.e2e.conftest import TINY_AGENT

PROMPTS = {
    p["name"]: p
    for p in json.loads((TINY_AGENT.parent / "tiny-agent.prompts.json").read_text())["prompts"]
}
MODEL = "tiny-agent"
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# Fields outside the SDK schema, as `Model.field`. Chat: the documented reasoning_content and
# llama.cpp-compatible timings extensions (docs/serving.md). Responses: the API reference's
# Response object carries `store` and its function_call_arguments.done event the call's `name`;
# the OpenResponses Response object also echoes the presence and frequency penalties used; this
# SDK version's models declare none of them.
CHAT_EXTENSIONS = {
    "ChatCompletion.timings",
    "ChatCompletionMessage.reasoning_content",
    "ChatCompletionChunk.timings",
    "ChoiceDelta.reasoning_content",
}
RESPONSE_EXTENSIONS = {
    "Response.store",
    "Response.presence_penalty",
    "Response.frequency_penalty",
    "ResponseFunctionCallArgumentsDoneEvent.name",
}


def extra_fields(model: BaseModel) -> set[str]:
    """Fields anywhere in `model` that their SDK schema does not declare, as `Model.field`."""
    found = {f"{type(model).__name__}.{k}" for k in model.model_extra or {}}
    for name in type(model).model_fields:
        found |= _extra_in(getattr(model, name))
    return found


def _extra_in(value: Any) -> set[str]:
    if isinstance(value, BaseModel):
        return extra_fields(value)
    if isinstance(value, list | tuple):
        return set().union(*(_extra_in(v) for v in value)) if value else set()
    return set()


def with_cache_writes(data: Any) -> Any:
    """`data` with `cache_write_tokens` added where the SDK's ResponseUsage requires it.

    ninfer's checkpoint-native usage reports `input_tokens_details.cached_tokens` only:
    ninfer proves reused prefixes but does not account cache writes, so the field is absent
    and is the one schema difference tolerated here."""
    if isinstance(data, dict):
        out = {k: with_cache_writes(v) for k, v in data.items()}
        if "cached_tokens" in out and "input_tokens" not in out:
            out.setdefault("cache_write_tokens", 0)
        return out
    if isinstance(data, list):
        return [with_cache_writes(v) for v in data]
    return data


def chat_body(name: str, **kw: Any) -> dict[str, Any]:
    p = PROMPTS[name]
    body = {
        "model": MODEL,
        "messages": p["messages"],
        "temperature": 0,
        "max_tokens": 200,
        "chat_template_kwargs": {"enable_thinking": p["enable_thinking"]},
    }
    if p["tools"]:
        body["tools"] = p["tools"]
    return body | kw


def responses_body(name: str, **kw: Any) -> dict[str, Any]:
    p = PROMPTS[name]
    body: dict[str, Any] = {
        "model": MODEL,
        "input": p["messages"][0]["content"],
        "temperature": 0,
        "max_output_tokens": 200,
    }
    if p["tools"]:
        body["tools"] = [
            {"type": "function", **{k: t["function"][k] for k in ("name", "description")}}
            | {"parameters": t["function"]["parameters"], "strict": False}
            for t in p["tools"]
        ]
    if not p["enable_thinking"]:
        body["reasoning"] = {"effort": "none"}
    return body | kw


def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps escapes non-ASCII as JavaScript clients do (httpx's json= writes UTF-8, which
    # cannot carry a lone surrogate)
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(base_url + path, content=content, headers=headers, timeout=120)


def sse_frames(base_url: str, path: str, body: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(event name or None, data) of every SSE frame; comments (keep-alives) are skipped."""
    with httpx.stream("POST", base_url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"]
        raw = r.read().decode()
    frames = []
    for block in raw.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
        data = "\n".join(line[len("data: ") :] for line in lines if line.startswith("data: "))
        assert len(names) <= 1 and data, block
        frames.append((names[0] if names else None, data))
    return frames


# -- Chat Completions -------------------------------------------------------------------------


def chat_aggregate(base_url: str, name: str, **kw: Any) -> ChatCompletion:
    r = post(base_url, "/v1/chat/completions", chat_body(name, **kw))
    assert r.status_code == 200, r.text
    c = ChatCompletion.model_validate(r.json(), strict=True)
    assert extra_fields(c) <= CHAT_EXTENSIONS
    assert c.id.startswith("chatcmpl-") and c.object == "chat.completion" and c.model == MODEL
    assert [ch.index for ch in c.choices] == [0] and c.choices[0].logprobs is None
    assert c.choices[0].message.role == "assistant" and c.choices[0].message.refusal is None
    u = c.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens is not None
    assert u.completion_tokens_details.reasoning_tokens is not None
    return c


def chat_stream(base_url: str, name: str, **kw: Any) -> list[ChatCompletionChunk]:
    """Every chunk of a streamed completion, validated, with the stream grammar checked:
    one id/created/model, the role first, one finish reason, usage last when asked, [DONE]."""
    frames = sse_frames(base_url, "/v1/chat/completions", chat_body(name, stream=True, **kw))
    assert all(event is None for event, _ in frames) and frames[-1][1] == "[DONE]"
    raw = [json.loads(data) for _, data in frames[:-1]]
    chunks = [ChatCompletionChunk.model_validate(c, strict=True) for c in raw]
    assert all(extra_fields(c) <= CHAT_EXTENSIONS for c in chunks)
    assert len({(c.id, c.created, c.model, c.object) for c in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-") and chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.delta.role is None for c in chunks[1:] for ch in c.choices)
    assert all([ch.index for ch in c.choices] in ([], [0]) for c in chunks)
    finishes = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    include_usage = (kw.get("stream_options") or {}).get("include_usage", False)
    assert finishes == [len(chunks) - (2 if include_usage else 1)]
    if include_usage:  # every chunk carries usage: null but the last, which has no choices
        assert all("usage" in c and c["usage"] is None for c in raw[:-1])
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
    else:
        assert all("usage" not in c for c in raw)
    assert "timings" in raw[-1] and all("timings" not in c for c in raw[:-1])
    return chunks


def joined(chunks: list[ChatCompletionChunk], field: str) -> str:
    return "".join(
        getattr(ch.delta, field, None) or (ch.delta.model_extra or {}).get(field) or ""
        for c in chunks
        for ch in c.choices
    )


def streamed_tool_calls(chunks: list[ChatCompletionChunk]) -> list[dict[str, Any]]:
    """Calls rebuilt from tool-call deltas; each call opens with its index, id, type and name
    (arguments ""), then carries only argument fragments, in index order."""
    calls: list[dict[str, Any]] = []
    for c in chunks:
        for ch in c.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.id is not None:
                    assert tc.index == len(calls) and tc.type == "function"
                    assert tc.function.name and tc.function.arguments == ""
                    calls.append({"id": tc.id, "name": tc.function.name, "arguments": ""})
                else:
                    assert tc.index == len(calls) - 1 and tc.type is None
                    assert tc.function.name is None and tc.function.arguments
                    calls[-1]["arguments"] += tc.function.arguments
    return calls


@pytest.mark.parametrize("name", ["sum_think", "capital"])
def test_chat_text_payloads_validate(live_server, name):
    p = PROMPTS[name]
    full = chat_aggregate(live_server.base_url, name)
    msg = full.choices[0].message
    assert msg.content == p["expected"]["content"] and full.choices[0].finish_reason == "stop"
    assert msg.tool_calls is None
    assert (msg.model_extra or {}).get("reasoning_content") == p["expected"]["reasoning"]
    chunks = chat_stream(live_server.base_url, name, stream_options={"include_usage": True})
    assert joined(chunks, "content") == msg.content
    assert joined(chunks, "reasoning_content") == (p["expected"]["reasoning"] or "")
    assert chunks[-2].choices[0].finish_reason == "stop"
    streamed = chunks[-1].usage
    assert streamed.completion_tokens == full.usage.completion_tokens
    assert streamed.prompt_tokens == full.usage.prompt_tokens
    reasoning = streamed.completion_tokens_details.reasoning_tokens
    assert (reasoning > 0) == bool(p["expected"]["reasoning"])


@pytest.mark.parametrize("name", ["weather_two", "search_recipes"])
def test_chat_tool_call_payloads_validate(live_server, name):
    p = PROMPTS[name]
    full = chat_aggregate(live_server.base_url, name)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", c["name"], c["arguments"]) for c in p["expected"]["tool_calls"]
    ]
    assert len({c.id for c in calls}) == len(calls)
    assert all(c.id.startswith("call_") for c in calls)
    # content is null when the turn is only calls, else the text before them
    if p["expected"]["content"]:
        assert choice.message.content.strip() == p["expected"]["content"]
    else:
        assert choice.message.content is None
    chunks = chat_stream(live_server.base_url, name)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    got = streamed_tool_calls(chunks)
    assert [(c["name"], c["arguments"]) for c in got] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert joined(chunks, "content") == (choice.message.content or "")


def test_chat_length_finish_validates(live_server):
    full = chat_aggregate(live_server.base_url, "capital", max_tokens=3)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 3
    chunks = chat_stream(live_server.base_url, "capital", max_tokens=3)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert joined(chunks, "content") == full.choices[0].message.content
    # zero output tokens: prompt processing only, with the same stream grammar
    chunks = chat_stream(
        live_server.base_url, "capital", max_tokens=0, stream_options={"include_usage": True}
    )
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 0 and joined(chunks, "content") == ""


# -- Responses --------------------------------------------------------------------------------


def response_of(data: dict[str, Any]) -> Response:
    r = Response.model_validate(with_cache_writes(data), strict=True)
    assert extra_fields(r) <= RESPONSE_EXTENSIONS, extra_fields(r)
    assert r.object == "response" and r.model == MODEL and r.id.startswith("resp_")
    if r.usage is not None:
        u = r.usage
        assert u.total_tokens == u.input_tokens + u.output_tokens
        assert u.input_tokens_details.cached_tokens <= u.input_tokens
        assert u.output_tokens_details.reasoning_tokens <= u.output_tokens
    return r


def responses_stream(base_url: str, body: dict[str, Any]) -> tuple[list[Any], Response]:
    """Every event of a streamed Response, validated, with its grammar checked; returns the
    events and the terminal Response."""
    frames = sse_frames(base_url, "/v1/responses", body | {"stream": True})
    events = []
    for name, data in frames:
        payload = json.loads(data)
        assert name == payload["type"], (name, payload["type"])
        event = STREAM_EVENT.validate_python(with_cache_writes(payload), strict=True)
        assert extra_fields(event) <= RESPONSE_EXTENSIONS, (name, extra_fields(event))
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in TERMINAL and sum(k in TERMINAL for k in kinds) == 1
    final = response_of(payload["response"])
    snapshots = [e.response for e in events if hasattr(e, "response")]
    assert {s.id for s in snapshots} == {final.id}
    assert [s.status for s in snapshots[:2]] == ["in_progress", "in_progress"]
    assert snapshots[0].output == [] and snapshots[0].usage is None
    _check_items(events, final)
    return events, final


def _check_items(events: list[Any], final: Response) -> None:
    """Per output Item: added, then its parts and deltas, then done, never interleaved with
    another Item; deltas concatenate to the done values and the terminal Item."""
    open_index: int | None = None
    text: dict[tuple[int, int], str] = {}
    args: dict[int, str] = {}
    done_items: list[Any] = []
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            assert open_index is None and e.output_index == len(done_items)
            open_index, item = e.output_index, e.item
            assert item.id == final.output[open_index].id and item.status == "in_progress"
            continue
        assert open_index is not None and e.output_index == open_index, e.type
        item_id = final.output[open_index].id
        if e.type == "response.output_item.done":
            assert e.item.model_dump() == final.output[open_index].model_dump()
            done_items.append(e.item)
            open_index = None
            continue
        assert e.item_id == item_id
        if e.type in ("response.output_text.delta", "response.reasoning_text.delta"):
            key = (e.output_index, e.content_index)
            text[key] = text.get(key, "") + e.delta
        elif e.type in ("response.output_text.done", "response.reasoning_text.done"):
            part = final.output[open_index].content[e.content_index]
            assert e.text == text.get((e.output_index, e.content_index), "") == part.text
        elif e.type in ("response.content_part.added", "response.content_part.done"):
            part = final.output[open_index].content[e.content_index]
            assert e.part.type == part.type
            assert e.part.text == ("" if e.type.endswith("added") else part.text)
        elif e.type == "response.function_call_arguments.delta":
            args[e.output_index] = args.get(e.output_index, "") + e.delta
        elif e.type == "response.function_call_arguments.done":
            call = final.output[open_index]
            assert e.arguments == args.get(e.output_index, "") == call.arguments
            assert e.name == call.name
        else:
            raise AssertionError(f"unexpected event {e.type}")
    assert open_index is None and len(done_items) == len(final.output)


def test_responses_stream_with_reasoning_text_and_call_validates(live_server):
    base = live_server.base_url
    p = PROMPTS["search_recipes"]
    events, final = responses_stream(base, responses_body("search_recipes"))
    assert final.status == "completed" and final.completed_at is not None
    assert final.incomplete_details is None and final.error is None
    assert {
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
    } <= {e.type for e in events}
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = final.output
    assert reasoning.summary == [] and reasoning.content[0].type == "reasoning_text"
    assert reasoning.content[0].text == p["expected"]["reasoning"]
    assert reasoning.id.startswith("rs_") and message.id.startswith("msg_")
    assert message.role == "assistant" and message.status == "completed"
    assert [c.type for c in message.content] == ["output_text"]
    assert message.content[0].annotations == [] and message.content[0].text.strip()
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.status == "completed" and json.loads(call.arguments)
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    # the aggregate of the same request carries the same Items, and a stored Response
    # is retrieved exactly as its terminal event carried it
    agg = post(base, "/v1/responses", responses_body("search_recipes"))
    assert agg.status_code == 200, agg.text
    same = response_of(agg.json())
    assert [o.model_dump(exclude={"id", "call_id"}) for o in same.output] == [
        o.model_dump(exclude={"id", "call_id"}) for o in final.output
    ]
    got = httpx.get(f"{base}/v1/responses/{final.id}")
    assert got.status_code == 200 and response_of(got.json()) == final


def test_responses_parallel_calls_and_continuation_validate(live_server):
    base = live_server.base_url
    body = responses_body("weather_two")
    _, first = responses_stream(base, body)
    calls = [o for o in first.output if o.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "London"]
    results = [
        {"type": "function_call_output", "call_id": c.call_id, "output": out}
        for c, out in zip(calls, ('{"temp": 22, "sky": "sunny"}', '{"temp": 15, "sky": "rain"}'))
    ]
    follow = {**body, "input": results, "previous_response_id": first.id}
    _, second = responses_stream(base, follow)
    assert second.previous_response_id == first.id and second.status == "completed"
    assert second.output_text == PROMPTS["weather_two_result"]["expected"]["content"]
    assert second.usage.input_tokens_details.cached_tokens > 0
    items = httpx.get(f"{base}/v1/responses/{second.id}/input_items", params={"order": "asc"})
    assert items.status_code == 200
    listed = ResponseItemList.model_validate(items.json(), strict=True)
    assert extra_fields(listed) == set()
    assert [(i.type, i.call_id) for i in listed.data] == [
        ("function_call_output", c.call_id) for c in calls
    ]
    assert listed.first_id == listed.data[0].id and listed.last_id == listed.data[-1].id
    assert listed.has_more is False


@pytest.mark.parametrize("name, limit", [("sum_think", 5), ("capital", 3)])
def test_responses_incomplete_validates(live_server, name, limit):
    base = live_server.base_url
    body = responses_body(name, max_output_tokens=limit)
    events, final = responses_stream(base, body)
    assert events[-1].type == "response.incomplete"
    for r in (final, response_of(post(base, "/v1/responses", body).json())):
        assert r.status == "incomplete" and r.completed_at is None
        assert r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == limit and r.max_output_tokens == limit
        assert len(r.output) == 1 and r.output[0].status == "incomplete"


def test_responses_delete_body(live_server):
    base = live_server.base_url
    r = response_of(
        post(base, "/v1/responses", responses_body("hello", max_output_tokens=2)).json()
    )
    deleted = httpx.delete(f"{base}/v1/responses/{r.id}")
    assert deleted.status_code == 200 and deleted.headers["x-request-id"]
    assert deleted.json() == {"id": r.id, "object": "response.deleted", "deleted": True}


# -- error bodies ---------------------------------------------------------------------------


BAD_REQUESTS = [
    ("/v1/chat/completions", {"model": MODEL}, 400, "missing_required_parameter", "messages"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": []}, 404, "model_not_found", "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 17}, 400, "invalid_value", "n"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "x", "content": "x"}]}, 400, "invalid_value", "messages[0].role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "invalid_type", "stream"),
    ("/v1/responses", {"model": MODEL}, 400, "missing_required_parameter", "input"),
    ("/v1/responses", {"model": MODEL, "input": "x", "frobnicate": 1}, 400, "unknown_parameter", "frobnicate"),
    ("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_0"}, 404, "response_not_found", "previous_response_id"),
    ("/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": -1}, 400, "invalid_value", "max_output_tokens"),
    ("/v1/responses", {"model": "other", "input": "x"}, 404, "model_not_found", "model"),
    # a lone surrogate escape (json.dumps writes "\\ud800") is not text: 400, not a tokenizer failure
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a\ud800"}]}, 400, "invalid_value", "messages[0].content"),
    ("/v1/responses", {"model": MODEL, "input": "x", "metadata": {"k": "\udfff"}}, 400, "invalid_value", "metadata.k"),
    ("/v1/responses/input_tokens", {"model": MODEL, "input": [{"role": "user", "content": "\ud83d"}]}, 400, "invalid_value", "input[0].content"),
]  # fmt: skip


@pytest.mark.parametrize("path, body, status, code, param", BAD_REQUESTS)
def test_error_bodies_validate(live_server, path, body, status, code, param):
    r = post(live_server.base_url, path, body)
    assert r.status_code == status and r.headers["x-request-id"]
    assert set(r.json()) == {"error"}
    err = ErrorObject.model_validate(r.json()["error"], strict=True)
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert (err.type, err.code, err.param) == ("invalid_request_error", code, param)
    assert err.message


def test_invalid_json_error_body(live_server):
    for content in (b"{not json", b"[1]"):
        r = httpx.post(
            live_server.base_url + "/v1/responses",
            content=content,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400
        err = ErrorObject.model_validate(r.json()["error"], strict=True)
        assert err.code == "invalid_json" and err.param is None

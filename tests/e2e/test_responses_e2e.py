"""OpenAI Responses against the real `ninfer serve`, driven by the official `openai` client.

The trained tiny agent (artifacts/fixtures/tiny-agent.ninfer) reasons, answers and calls tools
deterministically at temperature 0; conversations here follow its scripted prompts
(artifacts/fixtures/tiny-agent.prompts.json), expressed as Responses Items.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.e2e.conftest import TINY_AGENT

PROMPTS = {
    p["name"]: p
    for p in json.loads((TINY_AGENT.parent / "tiny-agent.prompts.json").read_text())["prompts"]
}
MODEL = "tiny-agent"


def responses_tool(chat_tool: dict) -> dict:
    """A Chat Completions tool definition in the flat Responses form."""
    fn = chat_tool["function"]
    return {
        "type": "function",
        "name": fn["name"],
        "description": fn["description"],
        "parameters": fn["parameters"],
        "strict": False,
    }


def tools_of(name: str) -> list[dict]:
    return [responses_tool(t) for t in PROMPTS[name]["tools"]]


WEATHER = tools_of("weather_paris")


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="unused", max_retries=0)


def create(client: openai.OpenAI, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 200)
    return client.responses.create(**kw)


def collect(stream) -> tuple[list, object]:
    """All events of a stream and the Response of its terminal event."""
    events = list(stream)
    assert events[-1].type in ("response.completed", "response.incomplete", "response.failed")
    return events, events[-1].response


def strip_ids(items: list) -> list[dict]:
    out = []
    for it in items:
        d = it.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        out.append(d)
    return out


def status_code(exc: openai.APIStatusError) -> tuple[int, str | None, str | None]:
    err = exc.response.json()["error"]
    return exc.status_code, err.get("code"), err.get("param")


# -- create, retrieve, list, delete -----------------------------------------------------------


def test_create_retrieve_list_delete(client):
    r = create(client, input="Hi!", reasoning={"effort": "none"}, metadata={"k": "v"})
    assert r.status == "completed" and r.completed_at is not None
    assert r.output_text == PROMPTS["hello"]["expected"]["content"]
    assert [o.type for o in r.output] == ["message"]
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_")
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.metadata == {"k": "v"} and r.store is True

    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id).data
    assert len(items) == 1 and items[0].type == "message" and items[0].role == "user"
    assert items[0].content[0].type == "input_text" and items[0].content[0].text == "Hi!"

    deleted = client.responses.delete(r.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert status_code(e.value)[:2] == (404, "response_not_found")
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_input_items_pagination(client):
    msgs = [
        {"type": "message", "role": "user", "content": t, "id": f"msg_page{i}"}
        for i, t in enumerate(["a", "b", "c"])
    ]
    msgs[-1]["content"] = "Hi!"
    r = create(client, input=msgs, reasoning={"effort": "none"}, max_output_tokens=4)
    page = client.responses.input_items.list(r.id, limit=2, order="asc")
    assert [i.id for i in page.data] == ["msg_page0", "msg_page1"] and page.has_more
    rest = client.responses.input_items.list(r.id, limit=2, order="asc", after="msg_page1")
    assert [i.id for i in rest.data] == ["msg_page2"] and not rest.has_more
    desc = client.responses.input_items.list(r.id)
    assert [i.id for i in desc.data] == ["msg_page2", "msg_page1", "msg_page0"]
    for bad in (0, 101):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.input_items.list(r.id, limit=bad)
        assert status_code(e.value)[2] == "limit"


def test_store_false_is_not_retained(client):
    r = create(client, input="Hi!", reasoning={"effort": "none"}, store=False)
    assert r.status == "completed" and r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        create(client, input="Hello", previous_response_id=r.id)
    assert status_code(e.value) == (404, "response_not_found", "previous_response_id")


def test_max_output_tokens_is_incomplete(client):
    r = create(client, input="Hi!", reasoning={"effort": "none"}, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.completed_at is None and r.usage.output_tokens == 3
    assert client.responses.retrieve(r.id).status == "incomplete"


# -- conversations and tools ------------------------------------------------------------------


def test_three_turn_chain_reuses_earlier_turns(client):
    r1 = create(client, input="Hi!", reasoning={"effort": "none"})
    assert r1.output_text == "Hello! How can I help you today?"
    r2 = create(
        client, input="What is the weather in Oslo?", tools=WEATHER, previous_response_id=r1.id
    )
    calls = [o for o in r2.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert calls[0].id.startswith("fc_") and calls[0].call_id.startswith("call_")
    # r2 ends with a call: a new question without the call's output is refused, as OpenAI
    # answers "No tool output found for function call <call_id>."
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="And in Bergen?", tools=WEATHER, previous_response_id=r2.id)
    assert status_code(e.value) == (400, "invalid_tool_history", "previous_response_id")
    assert calls[0].call_id in e.value.response.json()["error"]["message"]
    result = {
        "type": "function_call_output",
        "call_id": calls[0].call_id,
        "output": '{"temp": -2, "sky": "snow"}',
    }
    count = client.responses.input_tokens.count(
        model=MODEL, input=[result], tools=WEATHER, previous_response_id=r2.id
    )
    r3 = create(client, input=[result], tools=WEATHER, previous_response_id=r2.id)
    assert r3.output_text == PROMPTS["multi_oslo_result"]["expected"]["content"]
    assert r3.output[0].content[0].text == PROMPTS["multi_oslo_result"]["expected"]["reasoning"]
    # The third prompt extends the second prompt and its output: the retained chain covers it.
    assert r3.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens
    assert r3.usage.input_tokens_details.cached_tokens >= r2.usage.input_tokens
    assert count.input_tokens == r3.usage.input_tokens
    # input_items lists only what that request supplied
    assert [i.type for i in client.responses.input_items.list(r3.id).data] == [
        "function_call_output"
    ]


def test_input_tokens_equals_create_usage(client):
    args = {
        "input": "What is 2.5 plus 4?",
        "tools": tools_of("add_numbers"),
        "instructions": "Be brief.",
    }
    count = client.responses.input_tokens.count(model=MODEL, **args)
    r = create(client, **args)
    assert count.input_tokens == r.usage.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(client, stream):
    first = PROMPTS["weather_paris"]
    args = {"input": first["messages"][0]["content"], "tools": WEATHER}
    if stream:
        _events, r1 = collect(create(client, stream=True, **args))
        json_r1 = create(client, **args)
        assert strip_ids(r1.output) == strip_ids(json_r1.output)
    else:
        r1 = create(client, **args)
    assert r1.status == "completed"
    assert [o.type for o in r1.output] == ["reasoning", "function_call"]
    assert (
        r1.output[0].content[0].text == first["expected"]["reasoning"]
        and r1.output[0].summary == []
    )
    call = r1.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "days": 3}
    result = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": PROMPTS["weather_paris_result"]["messages"][2]["content"],
    }
    args2 = {"input": [result], "tools": WEATHER, "previous_response_id": r1.id}
    r2 = collect(create(client, stream=True, **args2))[1] if stream else create(client, **args2)
    assert r2.output_text == PROMPTS["weather_paris_result"]["expected"]["content"]


def test_tool_round_trip_without_stored_state(client):
    """A stateless client replays the whole conversation as Items (store:false)."""
    r1 = create(client, input="What is 2.5 plus 4?", tools=tools_of("add_numbers"), store=False)
    call = r1.output[-1]
    replay = [{"role": "user", "content": "What is 2.5 plus 4?"}]
    replay += [o.model_dump(exclude_none=True) for o in r1.output]
    replay += [
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"result": 6.5}'}
    ]
    r2 = create(client, input=replay, tools=tools_of("add_numbers"), store=False)
    assert r2.output_text == PROMPTS["add_result"]["expected"]["content"]


def test_allowed_tools_keep_the_prompt_and_restrict_calls(client):
    """allowed_tools renders every declared function (the prompt, and so its cache prefix, is
    the tool_choice:auto one) and only allowed functions become function_call Items: the
    agent's call of a function left out stays ordinary text, byte for byte."""
    p = PROMPTS["alarm_and_weather"]
    tools = tools_of("alarm_and_weather")
    only_alarm = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "set_alarm"}],
    }
    args = {"input": p["messages"][0]["content"], "tools": tools, "reasoning": {"effort": "none"}}
    auto = client.responses.input_tokens.count(model=MODEL, **args).input_tokens
    allowed = client.responses.input_tokens.count(model=MODEL, tool_choice=only_alarm, **args)
    assert allowed.input_tokens == auto
    r = create(client, tool_choice=only_alarm, **args)
    assert r.usage.input_tokens == auto
    assert not [o for o in r.output if o.type == "function_call"]
    text = r.output_text
    assert "<function=set_alarm>" in text and "<function=get_weather>" in text
    assert r.tool_choice.type == "allowed_tools"  # echoed as sent


def test_input_tokens_model_may_be_omitted(client):
    """As with OpenAI's endpoint, a count without `model` counts for the served model."""
    with_model = client.responses.input_tokens.count(model=MODEL, input="Hi!").input_tokens
    assert client.responses.input_tokens.count(input="Hi!").input_tokens == with_model
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="other-model", input="Hi!")


def test_stream_event_order_reasoning_text_and_tool(client, live_server):
    """search_recipes: reasoning, then text, then a tool call, in one streamed Response."""
    p = PROMPTS["search_recipes"]
    events, final = collect(
        create(
            client, input=p["messages"][0]["content"], tools=tools_of("search_recipes"), stream=True
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    expected_prefix = ["response.created", "response.in_progress"]
    assert kinds[:2] == expected_prefix and kinds[-1] == "response.completed"
    squash = []
    for k in kinds[2:-1]:
        if not (squash and squash[-1] == k and k.endswith(".delta")):
            squash.append(k)
    assert squash == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]  # fmt: skip
    out = final.output
    assert [o.type for o in out] == ["reasoning", "message", "function_call"]
    deltas: dict[tuple[int, str], str] = {}
    for e in events:
        if e.type.endswith(".delta"):
            deltas[(e.output_index, e.item_id)] = (
                deltas.get((e.output_index, e.item_id), "") + e.delta
            )
    assert deltas[(0, out[0].id)] == out[0].content[0].text == p["expected"]["reasoning"]
    assert deltas[(1, out[1].id)] == out[1].content[0].text  # text before the call, as generated
    assert out[1].content[0].text.strip() == p["expected"]["content"]
    assert deltas[(2, out[2].id)] == out[2].arguments
    assert json.loads(out[2].arguments) == {
        "query": "vegan recipes",
        "filters": {"tags": ["vegan"]},
    }
    for e in events:
        if e.type == "response.output_item.done":
            assert e.item.model_dump() == out[e.output_index].model_dump()
    # Wire framing: every event name equals its JSON type; no [DONE] sentinel.
    body = {
        "model": MODEL,
        "input": "Hi!",
        "reasoning": {"effort": "none"},
        "stream": True,
        "temperature": 0,
    }
    raw = httpx.post(live_server.base_url + "/v1/responses", json=body, timeout=60)
    assert raw.headers["x-request-id"]
    frames = [f for f in raw.text.split("\n\n") if f.strip() and not f.startswith(":")]
    for f in frames:
        name, data = f.split("\n", 1)
        assert (
            name.startswith("event: ")
            and json.loads(data[len("data: ") :])["type"] == name[len("event: ") :]
        )
    assert "[DONE]" not in raw.text


# -- rejections -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, code, param",
    [
        ({"frobnicate": 1}, "unknown_parameter", "frobnicate"),
        ({"conversation": "conv_1"}, "unsupported_parameter", "conversation"),
        ({"background": True}, "unsupported_value", "background"),
        ({"text": {"format": {"type": "yaml"}}}, "invalid_value", "text.format.type"),
        ({"truncation": "auto"}, "unsupported_value", "truncation"),
        ({"tools": [{"type": "web_search"}]}, "unsupported_value", "tools[0].type"),
        ({"tools": [dict(WEATHER[0], strict="yes")]}, "invalid_type", "tools[0].strict"),
        ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
        ({"tools": WEATHER, "parallel_tool_calls": False}, "unsupported_value", "parallel_tool_calls"),
        ({"temperature": 3}, "invalid_value", "temperature"),
        ({"input": [{"type": "input_file", "file_id": "f"}]}, "unsupported_value", "input[0].type"),
        ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}]}, "unsupported_value", "input[0].content"),
        ({"input": [{"role": "user", "content": "a", "id": "x"}, {"role": "user", "content": "b", "id": "x"}]}, "duplicate_item_id", "input[1].id"),
        ({"input": [{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "invalid_tool_history", "input[1]"),
        ({"input": [
            {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
            {"role": "assistant", "content": "late text"},
        ]}, "invalid_assistant_history", "input[1]"),
    ],
)  # fmt: skip
def test_rejections_name_the_field(client, extra, code, param):
    rest = {k: v for k, v in extra.items() if k != "input"}
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input=extra.get("input", "Hi!"), extra_body=rest)
    assert status_code(e.value)[1:] == (code, param)


def test_model_mismatch_and_missing_input(client):
    with pytest.raises(openai.NotFoundError):
        create(client, model="other-model", input="Hi!")
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input=[])
    assert status_code(e.value)[1:] == ("missing_required_parameter", "input")


def test_cancel_compact_and_stream_recovery_fail_explicitly(client, live_server):
    r = create(client, input="Hi!", reasoning={"effort": "none"}, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(r.id)
    assert status_code(e.value)[1] == "background_not_supported"
    raw = httpx.post(
        live_server.base_url + "/v1/responses/compact", json={"model": MODEL, "input": "x"}
    )
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "compaction_not_supported"
    assert raw.headers["x-request-id"]
    raw = httpx.get(f"{live_server.base_url}/v1/responses/{r.id}", params={"stream": "true"})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "stream"


# -- the store's bounds and authentication ----------------------------------------------------


def test_store_bounds_and_auth(server_factory):
    server = server_factory("--response-store-max-records", "2", api_key="local-secret")
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="local-secret", max_retries=0)
    ids = [
        create(c, input="Hi!", reasoning={"effort": "none"}, max_output_tokens=2).id
        for _ in range(3)
    ]
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(ids[0])  # least recently used: evicted
    assert c.responses.retrieve(ids[2]).id == ids[2]
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.responses.retrieve(ids[2])

    tiny = server_factory("--response-store-max-mib", "0")
    c = openai.OpenAI(base_url=tiny.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        create(c, input="Hi!", reasoning={"effort": "none"}, max_output_tokens=2)
    assert status_code(e.value)[1] == "response_store_capacity_exceeded"
    assert (
        create(
            c, input="Hi!", reasoning={"effort": "none"}, max_output_tokens=2, store=False
        ).status
        == "incomplete"
    )

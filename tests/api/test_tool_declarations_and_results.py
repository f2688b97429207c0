"""Tool declarations and tool results across the three protocols, on the real in-process server
(tiny trained agent, CPU): function names the Qwen call format cannot carry, parameter schemas
that do not describe an arguments object, and Chat Completions tool results matched to the
assistant calls they answer (unknown, duplicate and missing results; call order)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from ninfer.api.chat.request import parse_chat_request
from tests.api.live_app import app_client

MODEL = "tiny-agent"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def client(tiny_agent) -> Iterator[TestClient]:
    with app_client(tiny_agent, max_context=1024, thinking=False) as c:
        yield c


def chat_tool(name: str = "get_weather", parameters: Any = SCHEMA) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def call(call_id: str, city: str = "Paris") -> dict[str, Any]:
    args = json.dumps({"city": city})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": args},
    }


def chat(client: TestClient, messages: list[dict[str, Any]], **fields: Any) -> Any:
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "tools": [chat_tool()]}
    return client.post("/v1/chat/completions", json={**body, **fields})


def respond(client: TestClient, tools: list[dict[str, Any]]) -> Any:
    """A one-token Responses request declaring ``tools``."""
    return client.post(
        "/v1/responses",
        json={"model": MODEL, "input": "hi", "max_output_tokens": 1, "tools": tools},
    )


def openai_error(resp: Any, code: str, param: str) -> str:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", code, param)
    return err["message"]


def anthropic_error(resp: Any, code: str, param: str) -> str:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["details"] == {"error_code": code, "param": param}
    return body["error"]["message"]


USER = {"role": "user", "content": "Weather in Paris and Rome?"}


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["get weather", "a>b", "fn\nname", "x" * 129])
def test_uncallable_tool_names_are_refused_on_every_protocol(client, name):
    """A name outside letters, digits, '_', '-', '.', ':' (1..128) cannot be written as
    <function=NAME> and parsed back, so the tool could never be called: refused up front,
    as the official APIs refuse names outside their patterns (it used to be accepted)."""
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [USER], "max_tokens": 1, "tools": [chat_tool(name)]},
    )
    assert "tool name" in openai_error(r, "invalid_value", "tools[0].function.name")
    r = respond(client, [{"type": "function", "name": name, "parameters": SCHEMA}])
    openai_error(r, "invalid_value", "tools[0].name")
    r = client.post(
        "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 1,
            "messages": [USER],
            "tools": [{"name": name, "input_schema": SCHEMA}],
        },
    )
    anthropic_error(r, "invalid_value", "tools[0].name")


def test_callable_names_with_dots_colons_and_dashes_are_accepted(client):
    r = chat(client, [USER], tools=[chat_tool("ns.get-weather:v2"), chat_tool("x" * 128)])
    assert r.status_code == 200, r.text


def test_namespace_names_are_checked_with_their_engine_identity(client):
    def namespaced(ns: str, fn: str) -> Any:
        tool = {"type": "namespace", "name": ns, "tools": [{"type": "function", "name": fn}]}
        return respond(client, [tool])

    openai_error(namespaced("mcp weather", "get"), "invalid_value", "tools[0].name")
    message = openai_error(
        namespaced("n" * 100, "f" * 40), "invalid_value", "tools[0].tools[0].name"
    )
    assert "128" in message
    assert namespaced("mcp__weather", "get_current").status_code == 200


def test_parameters_schema_must_describe_an_object(client):
    """OpenAI refuses a function whose parameters schema is not of type object (Anthropic
    Messages already did); a schema without a top-level type stays accepted."""
    r = chat(client, [USER], tools=[chat_tool(parameters={"type": "array"})])
    message = openai_error(r, "invalid_value", "tools[0].function.parameters.type")
    assert "'object'" in message and "'array'" in message
    r = respond(client, [{"type": "function", "name": "f", "parameters": {"type": "string"}}])
    openai_error(r, "invalid_value", "tools[0].parameters.type")
    assert chat(client, [USER], tools=[chat_tool(parameters={"properties": {}})]).status_code == 200


# -- Chat Completions tool results ------------------------------------------------------------


def test_chat_tool_result_for_an_unknown_call_is_refused(client):
    messages = [
        USER,
        {"role": "assistant", "tool_calls": [call("call_1")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
    ]
    message = openai_error(
        chat(client, messages), "invalid_tool_history", "messages[2].tool_call_id"
    )
    assert "'call_2'" in message and "'call_1'" in message


def test_chat_duplicate_missing_and_orphan_results_are_refused(client):
    calls = {"role": "assistant", "tool_calls": [call("call_1"), call("call_2", "Rome")]}
    one = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    two = {"role": "tool", "tool_call_id": "call_2", "content": "rain"}
    r = chat(client, [USER, calls, one, one, two])
    openai_error(r, "invalid_tool_history", "messages[3].tool_call_id")
    r = chat(client, [USER, calls, one, {"role": "user", "content": "and?"}])
    assert "'call_2'" in openai_error(r, "invalid_tool_history", "messages[1].tool_calls")
    r = chat(client, [USER, calls, {"role": "user", "content": "never mind"}])
    openai_error(r, "invalid_tool_history", "messages[1].tool_calls")
    r = chat(client, [USER, {"role": "assistant", "content": "ok"}, one])
    openai_error(r, "invalid_tool_history", "messages[2]")
    r = chat(client, [USER, {"role": "assistant", "tool_calls": [call("call_1"), call("call_1")]}])
    openai_error(r, "invalid_tool_history", "messages[1].tool_calls[1].id")


def test_chat_valid_tool_histories_are_accepted(client):
    calls = {"role": "assistant", "tool_calls": [call("call_1"), call("call_2", "Rome")]}
    one = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    two = {"role": "tool", "tool_call_id": "call_2", "content": "rain"}
    assert chat(client, [USER, calls, one, two]).status_code == 200
    assert chat(client, [USER, calls, two, one]).status_code == 200
    # a history that begins with results (truncated or imported) stays valid
    system = {"role": "system", "content": "Be brief."}
    assert chat(client, [system, one, USER]).status_code == 200
    # calls without ids and legacy function history are not matched
    no_id = {"role": "assistant", "tool_calls": [{**call("x"), "id": None}]}
    assert chat(client, [USER, no_id, one]).status_code == 200
    legacy = {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}}
    result = {"role": "function", "name": "get_weather", "content": "sunny"}
    assert chat(client, [USER, legacy, result, USER]).status_code == 200


def test_chat_results_are_rendered_in_call_order():
    """The Qwen prompt has no call ids, so results are matched to calls by position: results
    sent out of order are put in call order, as Responses and Anthropic Messages do."""
    calls = {"role": "assistant", "tool_calls": [call("call_1"), call("call_2", "Rome")]}
    one = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    two = {"role": "tool", "tool_call_id": "call_2", "content": "rain"}
    body = {"model": MODEL, "tools": [chat_tool()]}
    swapped = parse_chat_request(
        {**body, "messages": [USER, calls, two, one]}, model_id=MODEL, vision=False
    )
    ordered = parse_chat_request(
        {**body, "messages": [USER, calls, one, two]}, model_id=MODEL, vision=False
    )
    assert [m.tool_call_id for m in swapped.messages] == [None, None, "call_1", "call_2"]
    assert swapped.template_messages() == ordered.template_messages()


# -- Responses tool results --------------------------------------------------------------------

FLAT_TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
FC = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
FC_OUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}


def respond_items(client: TestClient, items: list[dict[str, Any]], path: str = "/v1/responses"):
    body = {"model": MODEL, "input": items, "tools": [FLAT_TOOL]}
    if path == "/v1/responses":
        body |= {"max_output_tokens": 1, "store": False}
    return client.post(path, json=body)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/input_tokens"])
def test_responses_call_without_output_is_refused(client, path):
    """As OpenAI answers 400 "No tool output found for function call <call_id>.", a
    function_call that no function_call_output answers is refused, whether it ends the input
    or a later message follows it (both used to be accepted and rendered unanswered)."""
    message = openai_error(
        respond_items(client, [USER, FC], path), "invalid_tool_history", "input[1]"
    )
    assert message.startswith("No tool output found for function call 'call_1'")
    later = [USER, FC, {"role": "user", "content": "never mind"}]
    openai_error(respond_items(client, later, path), "invalid_tool_history", "input[1]")
    # calls answered by the last Items are an ordinary tool-result turn
    assert respond_items(client, [USER, FC, FC_OUT], path).status_code == 200


@pytest.mark.parametrize("arguments", ["{", "[1]", ""])
def test_tool_call_arguments_that_are_not_a_json_object_are_refused_as_in_responses(
    client, arguments
):
    """An assistant call whose arguments are not the JSON text of an object, answered by a tool
    result: Chat refuses it with the same 400 as Responses gives the same history, naming the
    field (it was accepted and rendered as garbage)."""
    bad = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [bad]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    message = openai_error(
        chat(client, messages), "invalid_value", "messages[1].tool_calls[0].function.arguments"
    )
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    body = {"model": MODEL, "input": items, "max_output_tokens": 1, "tools": [
        {"type": "function", "name": "get_weather", "parameters": SCHEMA}]}  # fmt: skip
    responses = openai_error(
        client.post("/v1/responses", json=body), "invalid_value", "input[1].arguments"
    )
    assert (
        message.split(": ", 1)[1]
        == responses.split(": ", 1)[1]
        == "must be the JSON text of an object"
    )

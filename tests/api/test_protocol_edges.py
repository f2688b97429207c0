"""Less-common request shapes across the three protocols, on the real in-process server (tiny
trained agent, CPU): top_p 0 on every protocol, empty Responses input, the context-limit error
naming each protocol's own conversation field, and range-error wording."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.api.live_app import app_client

MODEL = "tiny-agent"
MAX_CONTEXT = 256
QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."  # its greedy reply (tiny-agent.prompts.json)


@pytest.fixture(scope="module")
def client(tiny_agent) -> Iterator[TestClient]:
    with app_client(tiny_agent, max_context=MAX_CONTEXT, thinking=False) as c:
        yield c


def openai_error(resp: Any, status: int, code: str, param: str | None) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", code, param)
    return err["message"]


# -- top_p 0 -------------------------------------------------------------------------------------


def test_top_p_zero_is_argmax_on_every_protocol(client):
    """top_p is valid in [0, 1] on every protocol; 0 keeps only the most likely token, so the
    reply is the greedy one even at a high temperature (it used to fail on Responses and
    Messages with a parameterless engine error)."""
    chat = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": QUESTION}],
            "top_p": 0,
            "temperature": 1.0,
        },
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == ANSWER

    resp = client.post(
        "/v1/responses",
        json={"model": MODEL, "input": QUESTION, "top_p": 0, "temperature": 2.0, "store": False},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "completed"
    assert body["output"][-1]["content"][0]["text"] == ANSWER
    # the response echoes the sampler used: top_p 0 is argmax (temperature 0, no nucleus cut)
    assert (body["temperature"], body["top_p"]) == (0.0, 1.0)

    msg = client.post(
        "/v1/messages",
        json={
            "model": "any",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": QUESTION}],
            "top_p": 0,
            "temperature": 1.0,
        },
    )
    assert msg.status_code == 200, msg.text
    assert msg.json()["content"] == [{"type": "text", "text": ANSWER}]
    assert msg.json()["stop_reason"] == "end_turn"


# -- empty Responses input -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/input_tokens"])
@pytest.mark.parametrize("empty", ["", []])
def test_empty_input_needs_a_previous_user_query(client, path, empty):
    """`input` may be empty only when previous_response_id already supplies a user query; an
    empty string is not a user turn with no text."""
    r = client.post(path, json={"model": MODEL, "input": empty})
    message = openai_error(r, 400, "missing_required_parameter", "input")
    assert "empty" in message and "previous_response_id" in message


def test_omitted_input_is_still_missing(client):
    r = client.post("/v1/responses", json={"model": MODEL})
    openai_error(r, 400, "missing_required_parameter", "input")


def test_empty_input_continues_a_stored_chain(client):
    parent = client.post(
        "/v1/responses", json={"model": MODEL, "input": QUESTION, "max_output_tokens": 4}
    )
    assert parent.status_code == 200, parent.text
    pid = parent.json()["id"]
    for path in ("/v1/responses/input_tokens", "/v1/responses"):
        body = {"model": MODEL, "input": "", "previous_response_id": pid}
        if path == "/v1/responses":
            body["max_output_tokens"] = 2
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
    child = r.json()["id"]
    items = client.get(f"/v1/responses/{child}/input_items")
    assert items.status_code == 200, items.text
    assert items.json()["data"] == []  # the empty string added no (empty) user message
    # and it counts exactly like omitting input
    omitted = client.post(
        "/v1/responses/input_tokens", json={"model": MODEL, "previous_response_id": pid}
    )
    empty = client.post(
        "/v1/responses/input_tokens",
        json={"model": MODEL, "input": "", "previous_response_id": pid},
    )
    assert omitted.json()["input_tokens"] == empty.json()["input_tokens"]


# -- context limit names each protocol's conversation field ---------------------------------------


LONG = "Paris " * (2 * MAX_CONTEXT)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
        ("/v1/responses", {"input": LONG}, "input"),
        ("/v1/responses/input_tokens", {"input": LONG}, "input"),
    ],
)
def test_context_length_exceeded_names_the_conversation_field(client, path, body, param):
    r = client.post(path, json={"model": MODEL, **body})
    message = openai_error(r, 400, "context_length_exceeded", param)
    assert str(MAX_CONTEXT) in message


def test_anthropic_context_length_exceeded_names_messages(client):
    r = client.post(
        "/v1/messages",
        json={"model": "any", "max_tokens": 8, "messages": [{"role": "user", "content": LONG}]},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["details"] == {"error_code": "context_length_exceeded", "param": "messages"}


# -- range wording -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
            "max_tokens",
            "'max_tokens': must be >= 0, got -1",
        ),
        (
            "/v1/responses",
            {"model": MODEL, "input": "x", "max_output_tokens": -3},
            "max_output_tokens",
            "'max_output_tokens': must be >= 0, got -3",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_k": 21},
            "top_k",
            "'top_k': must be in 0..20, got 21",
        ),
    ],
)
def test_integer_range_errors_read_as_sentences(client, path, body, param, message):
    assert openai_error(client.post(path, json=body), 400, "invalid_value", param) == message

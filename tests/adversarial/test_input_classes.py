"""Input classes that used to end in HTTP 500 (33 of 4,565 fuzzed bodies) get a 400 naming the
field, in each protocol's error shape; bodies that are not plain JSON get 415; template helpers
cannot be replaced through chat_template_kwargs; error messages quote client values in bounded
length. Driven through the real app and engine on the tiny trained model."""

from __future__ import annotations

import json

import pytest

from ninfer.api.service.template import _environment
from ninfer.api.service.template_options import TEMPLATE_HELPERS
from ninfer.api.wire import errors
from tests.api.live_app import app_client

MODEL = "tiny-agent"
USER = [{"role": "user", "content": "hi"}]
BODIES = {  # path -> a valid body the cases below corrupt
    "/v1/chat/completions": {"model": MODEL, "messages": USER, "max_tokens": 1},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 1},
    "/v1/responses/input_tokens": {"model": MODEL, "input": "hi"},
    "/v1/messages": {"model": MODEL, "messages": USER, "max_tokens": 1},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": USER},
}
GENERATE = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
FLOAT_FIELD = {"/v1/chat/completions": "temperature", "/v1/responses": "top_p",
               "/v1/messages": "temperature"}  # fmt: skip
TEXT_FIELD = {  # path -> (member holding the prompt text, the param an error names)
    "/v1/chat/completions": ("messages", "messages[0].content"),
    "/v1/responses": ("input", "input"),
    "/v1/responses/input_tokens": ("input", "input"),
    "/v1/messages": ("messages", "messages[0].content"),
    "/v1/messages/count_tokens": ("messages", "messages[0].content"),
}


@pytest.fixture(scope="module")
def client(tiny_agent):
    with app_client(tiny_agent, max_context=2048) as c:
        c.headers["content-type"] = "application/json"
        yield c


def error_of(r, status: int) -> dict:
    """The error object of either protocol's shape, with `param` and `code` read uniformly."""
    assert r.status_code == status, r.text
    body = r.json()
    if body.get("type") == "error":  # Anthropic: {"type":"error","error":{...,"details":{...}}}
        details = body["error"].get("details", {})
        return {**body["error"], "param": details.get("param"), "code": details.get("error_code")}
    return body["error"]


def raw_body(path: str, **replace: str) -> bytes:
    """BODIES[path] as JSON with members replaced by raw JSON text (to write what json.dumps
    would not: 4000-digit numbers, raw surrogate bytes)."""
    body = dict(BODIES[path])
    marks = {k: f"@@{k}@@" for k in replace}
    body.update(marks)
    text = json.dumps(body).encode()
    for k, v in replace.items():
        text = text.replace(json.dumps(marks[k]).encode(), v.encode("utf-8", "surrogatepass"))
    return text


@pytest.mark.parametrize("path", GENERATE)
def test_a_4000_digit_integer_in_a_float_field_is_400(client, path):
    field = FLOAT_FIELD[path]
    r = client.post(path, content=raw_body(path, **{field: "1" * 4000}))
    err = error_of(r, 400)
    assert err["param"] == field and "finite" in err["message"]
    assert len(err["message"]) < 200  # the 4000 digits are not echoed


@pytest.mark.parametrize("path", list(BODIES))
def test_raw_utf8_surrogate_bytes_are_400_naming_the_field(client, path):
    member, param = TEXT_FIELD[path]
    text = (
        json.dumps("a\ud800b", ensure_ascii=False)
        .encode("utf-8", "surrogatepass")
        .decode("utf-8", "surrogatepass")
    )  # '"a<ED A0 80>b"' once encoded with surrogatepass
    value = (
        text
        if member == "input"
        else json.dumps([{"role": "user", "content": "@"}]).replace('"@"', text)
    )
    r = client.post(path, content=raw_body(path, **{member: value}))
    err = error_of(r, 400)
    assert err["param"] == param and "surrogate" in err["message"]


def test_anthropic_stream_with_raw_surrogates_is_refused_before_it_starts(client):
    path = "/v1/messages"
    value = '[{"role": "user", "content": "a\ud800b"}]'
    r = client.post(path, content=raw_body(path, messages=value, stream="true"))
    err = error_of(r, 400)
    assert err["param"] == "messages[0].content"


@pytest.mark.parametrize("depth", [500, 900])
@pytest.mark.parametrize("path", GENERATE)
def test_chat_template_kwargs_nested_hundreds_deep_is_400(client, path, depth):
    deep = "[" * depth + "]" * depth
    r = client.post(path, content=raw_body(path, chat_template_kwargs=f'{{"x": {deep}}}'))
    err = error_of(r, 400)
    assert err["param"].startswith("chat_template_kwargs.x[0][0]") and "nested" in err["message"]
    assert len(err["param"]) <= 120


@pytest.mark.parametrize("depth", [990, 2000])
def test_tool_call_arguments_nested_990_deep_are_400(client, depth):
    args = "[" * depth + "]" * depth
    body = {
        "model": MODEL,
        "max_tokens": 1,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }  # fmt: skip
    err = error_of(client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == "messages[1].tool_calls[0].function.arguments"


@pytest.mark.parametrize(
    ("headers", "what"),
    [
        ({"content-type": "text/plain"}, "text/plain"),
        (
            {"content-type": "application/x-www-form-urlencoded"},
            "application/x-www-form-urlencoded",
        ),
        ({"content-type": "multipart/form-data; boundary=x"}, "multipart/form-data"),
        ({"content-type": ""}, "Content-Type"),
        ({"content-type": "application/json", "content-encoding": "gzip"}, "gzip"),
        ({"content-type": "application/json; charset=latin-1"}, "latin-1"),
    ],
)
@pytest.mark.parametrize("path", list(BODIES))
def test_bodies_that_are_not_plain_json_are_415(client, path, headers, what):
    content = json.dumps(BODIES[path]).encode()
    r = client.post(path, content=content, headers=headers)
    err = error_of(r, 415)
    assert err["code"] == "unsupported_media_type" and what in err["message"]


def test_a_body_without_content_type_is_415(client):
    content = json.dumps(BODIES["/v1/chat/completions"]).encode()
    del client.headers["content-type"]
    try:
        r = client.post("/v1/chat/completions", content=content)
    finally:
        client.headers["content-type"] = "application/json"
    assert error_of(r, 415)["code"] == "unsupported_media_type"


def test_json_with_a_utf8_charset_is_served(client):
    r = client.post(
        "/v1/chat/completions",
        content=json.dumps(BODIES["/v1/chat/completions"]).encode(),
        headers={"content-type": "Application/JSON; charset=UTF-8"},
    )
    assert r.status_code == 200, r.text


def test_template_helpers_cover_the_environment():
    assert set(_environment().globals) <= TEMPLATE_HELPERS


@pytest.mark.parametrize(
    "name", ["raise_exception", "strftime_now", "namespace", "range", "cycler"]
)
@pytest.mark.parametrize("path", GENERATE)
def test_chat_template_kwargs_cannot_replace_template_helpers(client, path, name):
    body = {**BODIES[path], "chat_template_kwargs": {name: "x"}}
    err = error_of(client.post(path, json=body), 400)
    assert err["param"] == f"chat_template_kwargs.{name}" and "helper" in err["message"]


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "model", "m" * 100_000),
        ("/v1/chat/completions", "reasoning_effort", "e" * 100_000),
        ("/v1/chat/completions", "seed", 10**300),
        ("/v1/messages", "thinking", {"type": "t" * 100_000}),
        (
            "/v1/responses",
            "tool_choice",
            {"type": "allowed_tools", "mode": "m" * 100_000, "tools": []},
        ),
    ],
)
def test_error_messages_echo_client_values_in_bounded_length(client, path, field, value):
    r = client.post(path, json={**BODIES[path], field: value})
    assert 400 <= r.status_code < 500, r.text
    assert len(r.text) < 2 * errors.MAX_MESSAGE_CHARS

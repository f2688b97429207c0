"""Anthropic Messages errors end to end: refusals naming the missing capability, advisory
fields, authentication, the body limit and admission overload, in Anthropic's error shape, on
one real `ninfer serve` (one lane, no queue, an API key) driven by the official client."""

from __future__ import annotations

import threading
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.test_anthropic_generation import GREEDY, client, post, prompt, request_of

# -- authentication, body limit and overload on a dedicated server --------------------------------

KEY = "local-secret"
AUTH = {"x-api-key": KEY}


@pytest.fixture(scope="module")
def strict_server(server_factory):
    return server_factory(
        "--max-concurrency", "1", "--max-pending-requests", "0", "--max-request-mib", "1", "--max-context", "2048",
        api_key=KEY,
    )  # fmt: skip


# -- rejections -----------------------------------------------------------------------------------

HI = [{"role": "user", "content": "Hi!"}]
WEATHER = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}
EPH = {"type": "ephemeral"}


def marked(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(
            {"role": "user", "content": [{"type": "text", "text": f"m{i}", "cache_control": EPH}]}
        )
        out.append({"role": "assistant", "content": "ok"})
    return out[:-1]


REJECTIONS = [
    ("max_tokens_zero", {"max_tokens": 0}, "unsupported_value"),
    (
        "image_without_vision",
        {"messages": [{"role": "user", "content": [IMAGE]}]},
        "vision_disabled",
    ),
    (
        "document",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "d"},
                        }
                    ],
                }
            ]
        },
        "unsupported_value",
    ),
    (
        "search_result",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "search_result", "source": "s", "title": "t", "content": []}
                    ],
                }
            ]
        },
        "unsupported_value",
    ),
    (
        "file_image",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "file", "file_id": "file_1"}}],
                }
            ]
        },
        "unsupported_value",
    ),
    (
        "container_upload",
        {
            "messages": [
                {"role": "user", "content": [{"type": "container_upload", "file_id": "file_1"}]}
            ]
        },
        "unsupported_value",
    ),
    (
        "redacted_thinking",
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "x"},
                        {"type": "text", "text": "a"},
                    ],
                },
                {"role": "user", "content": "r"},
            ]
        },
        "unsupported_value",
    ),
    (
        "server_tool_result",
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "web_search_tool_result", "tool_use_id": "s", "content": []}
                    ],
                },
                {"role": "user", "content": "r"},
            ]
        },
        "unsupported_value",
    ),
    (
        "structured_outputs_bad_schema",
        {"output_config": {"format": {"type": "json_schema", "schema": {"type": "strin"}}}},
        "invalid_schema",
    ),
    (
        "mcp_servers",
        {"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]},
        "unsupported_parameter",
    ),
    ("container", {"container": "container_1"}, "unsupported_parameter"),
    (
        "server_tool",
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "unsupported_value",
    ),
    ("toolset", {"tools": [{"type": "mcp_toolset", "mcp_server_name": "x"}]}, "unsupported_value"),
    ("strict_tool_flag", {"tools": [{**WEATHER, "strict": "yes"}]}, "invalid_type"),
    ("deferred_tool", {"tools": [{**WEATHER, "defer_loading": True}]}, "unsupported_value"),
    (
        "no_direct_calls",
        {"tools": [{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]},
        "unsupported_value",
    ),
    ("tool_choice_any_without_tools", {"tool_choice": {"type": "any"}}, "invalid_value"),
    (
        "tool_choice_named_undeclared",
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        "invalid_value",
    ),
    (
        "single_call",
        {"tools": [WEATHER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
        "unsupported_value",
    ),
    (
        "thinking_omitted_display",
        {
            "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
        },
        "unsupported_value",
    ),
    (
        "thinking_budget_small",
        {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 1000}},
        "invalid_value",
    ),
    (
        "thinking_budget_over_max",
        {"max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        "invalid_value",
    ),
    (
        "prefill_with_thinking",
        {
            "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [*HI, {"role": "assistant", "content": "Hel"}],
        },
        "unsupported_value",
    ),
    (
        "prefill_with_tool_use",
        {
            "tools": [WEATHER],
            "messages": [
                *HI,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
                    ],
                },
            ],
        },
        "unsupported_value",
    ),
    (
        "missing_tool_result",
        {
            "tools": [WEATHER],
            "messages": [
                *HI,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
                    ],
                },
                {"role": "user", "content": "and?"},
            ],
        },
        "invalid_value",
    ),
    ("five_breakpoints", {"messages": marked(5)}, "invalid_value"),
    (
        "bad_ttl",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": "x",
                            "cache_control": {"type": "ephemeral", "ttl": "24h"},
                        }
                    ],
                }
            ]
        },
        "invalid_value",
    ),
    (
        "request_level_conflict",
        {"messages": marked(1), "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        "invalid_value",
    ),
    (
        "request_level_no_slot",
        {
            "messages": [
                *marked(4),
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "y"},
            ],
            "cache_control": EPH,
        },
        "invalid_value",
    ),
    ("empty_model", {"model": ""}, "invalid_value"),
    ("no_messages", {"messages": []}, "invalid_value"),
]


@pytest.mark.parametrize("body, code", [pytest.param(b, c, id=n) for n, b, c in REJECTIONS])
def test_rejections(strict_server, body, code):
    full = {"model": "m", "max_tokens": 64, "messages": HI, **body}
    r = post(strict_server, "/v1/messages", full, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["details"]["error_code"] == code
    assert err["request_id"] == r.headers["request-id"]


def test_a_lone_surrogate_is_a_field_error(strict_server):
    # as JSON.stringify writes it; the tokenizer cannot take it, so it must not reach it
    raw = b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "\\udc01"}]}'
    headers = {**AUTH, "content-type": "application/json"}
    r = httpx.post(f"{strict_server.base_url}/v1/messages", content=raw, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "messages[0].content" in err["message"]
    assert err["details"]["error_code"] == "invalid_value"


def test_rejection_through_the_official_client(strict_server):
    c = client(strict_server, api_key=KEY)
    with pytest.raises(anthropic.BadRequestError) as info:
        c.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": [IMAGE]}])
    assert info.value.status_code == 400 and info.value.error_code == "vision_disabled"
    assert info.value.request_id and info.value.type == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        c.messages.count_tokens(model="m", messages=[{"role": "user", "content": [IMAGE]}])
    # a forced tool choice is honoured now (constrained decoding), not refused
    bounded = {
        "name": "get_weather",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    }
    msg = c.messages.create(
        model="m",
        max_tokens=64,
        messages=HI,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        tools=[bounded],
        thinking={"type": "disabled"},
    )
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert use.name == "get_weather" and len(use.input["city"]) <= 12


def test_advisory_fields_do_not_block(strict_server):
    body = {
        "model": "m",
        "max_tokens": 32,
        "messages": HI,
        "metadata": {"user_id": "u"},
        "service_tier": "auto",
        "inference_geo": "us",
        "unknown_field": [1, 2],
        "thinking": {"type": "disabled"},
        **GREEDY,
    }
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "some-beta-2025", **AUTH}
    r = post(strict_server, "/v1/messages", body, headers=headers)
    assert r.status_code == 200, r.text


def test_auth_with_x_api_key_or_bearer(strict_server):
    with pytest.raises(anthropic.AuthenticationError) as info:
        client(strict_server, api_key="wrong").messages.create(model="m", max_tokens=8, messages=HI)
    assert info.value.status_code == 401 and info.value.type == "authentication_error"
    assert info.value.request_id
    body = {"model": "m", "max_tokens": 8, "messages": HI}
    r = post(strict_server, "/v1/messages", body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.json()["request_id"] == r.headers["request-id"]
    ok = client(strict_server, api_key=KEY).messages.create(
        model="m", max_tokens=8, messages=HI, thinking={"type": "disabled"}
    )
    assert ok.content
    bearer = anthropic.Anthropic(base_url=strict_server.base_url, auth_token=KEY, max_retries=0)
    assert bearer.messages.count_tokens(model="m", messages=HI).input_tokens > 0


def test_body_limit_in_anthropic_shape(strict_server):
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "x" * (1024 * 1024 + 100)}],
    }
    r = post(strict_server, "/v1/messages", body, headers={"x-api-key": KEY})
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "request_too_large" and r.headers["request-id"]


def test_admission_overload_is_529(strict_server, tiny_agent_prompts):
    """One lane and no queue: concurrent requests beyond the first are refused with 529."""
    p = prompt(tiny_agent_prompts, "count")
    req = request_of(p)
    body = {k: v for k, v in req.items() if k != "extra_body"} | GREEDY
    n = 6
    barrier = threading.Barrier(n)
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def send() -> None:
        barrier.wait()
        r = post(strict_server, "/v1/messages", body, headers={"x-api-key": KEY})
        with lock:
            results.append(r)

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results)
    assert 200 in statuses and 529 in statuses, statuses
    overloaded = next(r for r in results if r.status_code == 529)
    err = overloaded.json()
    assert (
        err["error"]["type"] == "overloaded_error"
        and err["request_id"] == overloaded.headers["request-id"]
    )
    # the official client surfaces it as an overloaded error (retries disabled)
    assert issubclass(anthropic.OverloadedError, anthropic.APIStatusError)

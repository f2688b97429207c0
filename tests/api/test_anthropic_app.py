"""The Anthropic endpoints inside the real app (no engine): request-id headers, the Anthropic
error shape for handler errors and for app-level 401/404/405/413, and the status mapping."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from ninfer.api.server.app import create_app
from ninfer.api.server.state import ServerState
from ninfer.api.wire import errors
from ninfer.api.wire.anthropic_errors import anthropic_error_body, anthropic_status
from tests.api.live_app import serve_config

KEY = "local-secret"
BODY = {"model": "any-label", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}


def make_client(**options: Any) -> TestClient:
    options.setdefault("max_context", 4096)
    state = ServerState(config=serve_config(**options), model_id="tiny", created=1700000000)
    app = create_app(state, protocol_modules=("ninfer.api.anthropic.endpoints",))
    client = TestClient(app=app, raise_server_exceptions=False)
    client.headers["content-type"] = "application/json"  # bodies are JSON (415 otherwise)
    return client


def assert_anthropic_error(resp, status: int, kind: str, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert body["error"]["type"] == kind and body["error"]["message"]
    rid = resp.headers["request-id"]
    assert rid.startswith("req_") and body["request_id"] == rid
    assert "x-request-id" not in resp.headers
    if code is not None:
        assert body["error"]["details"]["error_code"] == code
    return body


@pytest.fixture
def client():
    with make_client() as c:
        yield c


def test_handler_errors_use_the_anthropic_shape(client):
    r = client.post("/v1/messages", content=b"{not json")
    assert_anthropic_error(r, 400, "invalid_request_error", "invalid_json")
    r = client.post("/v1/messages", json={**BODY, "max_tokens": 0})
    body = assert_anthropic_error(r, 400, "invalid_request_error", "unsupported_value")
    assert body["error"]["details"]["param"] == "max_tokens"
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    r = client.post(
        "/v1/messages/count_tokens",
        json={"model": "m", "messages": [{"role": "user", "content": [image]}]},
    )
    assert_anthropic_error(r, 400, "invalid_request_error", "vision_disabled")


def test_every_response_gets_a_distinct_request_id(client):
    ids = {client.post("/v1/messages", json=BODY).headers["request-id"] for _ in range(3)}
    assert len(ids) == 3


def test_no_engine_is_an_api_error(client):
    r = client.post("/v1/messages", json=BODY)
    assert_anthropic_error(r, 503, "api_error", "engine_unavailable")


def test_unknown_route_and_method_in_anthropic_shape(client):
    assert_anthropic_error(client.post("/v1/messages/batches", json=BODY), 404, "not_found_error")
    assert_anthropic_error(client.get("/v1/messages"), 405, "invalid_request_error")
    other = client.get("/v1/nothing-here")
    assert (
        other.status_code == 404
        and "x-request-id" in other.headers
        and "code" in other.json()["error"]
    )


def test_auth_accepts_x_api_key_and_bearer_and_answers_401_in_anthropic_shape():
    with make_client(api_key=KEY) as c:
        assert_anthropic_error(c.post("/v1/messages", json=BODY), 401, "authentication_error")
        assert_anthropic_error(
            c.post("/v1/messages", json=BODY, headers={"x-api-key": "wrong"}),
            401,
            "authentication_error",
        )
        for headers in ({"x-api-key": KEY}, {"Authorization": f"Bearer {KEY}"}):
            # past authentication: no engine here, so the service is unavailable
            assert_anthropic_error(
                c.post("/v1/messages", json=BODY, headers=headers), 503, "api_error"
            )


def test_body_limit_answers_413_in_anthropic_shape():
    with make_client(max_request_mib=1) as c:
        big = b'{"model": "m", "messages": [], "pad": "' + b"x" * (1024 * 1024 + 10) + b'"}'
        r = c.post("/v1/messages", content=big)
        assert_anthropic_error(r, 413, "request_too_large", "request_too_large")


@pytest.mark.parametrize(
    "err, status, kind",
    [
        (errors.server_overloaded(), 529, "overloaded_error"),
        (errors.request_queue_timeout(1000), 504, "timeout_error"),
        (
            errors.ApiError(
                504, "media fetch timed out", type="server_error", code="media_fetch_timeout"
            ),
            504,
            "timeout_error",
        ),
        (errors.unauthorized(), 401, "authentication_error"),
        (errors.model_not_found("a", "b"), 404, "not_found_error"),
        (errors.request_too_large(1), 413, "request_too_large"),
        (errors.invalid_value("x", "bad"), 400, "invalid_request_error"),
        (errors.internal_error(), 500, "api_error"),
    ],
)
def test_status_mapping(err, status, kind):
    assert anthropic_status(err) == (status, kind)
    got, body = anthropic_error_body(err, "req_1")
    assert got == status and body["error"]["type"] == kind and body["request_id"] == "req_1"

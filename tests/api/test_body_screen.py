"""Large bodies are screened in a worker process (ninfer.api.service.body_screen): one whose
prompt is over the context is refused without the server building its text, with the very
response the server gives when it prepares the body itself; everything else is prepared in the
server as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from ninfer.api.service.body_screen import SCREEN_BYTES, BodyScreen
from tests.api.live_app import app_client

TEXT = "The quick brown fox jumps over the lazy dog, said Émile 😀. "
LONG = TEXT * (2 * SCREEN_BYTES // len(TEXT.encode()))  # a body of about 2 MiB
USER = [{"role": "user", "content": LONG}]
OVER = {
    "chat": ("/v1/chat/completions", {"model": "tiny-agent", "messages": USER, "max_tokens": 1}),
    "chat stream": ("/v1/chat/completions", {"model": "tiny-agent", "messages": USER,
                                             "stream": True}),
    "responses": ("/v1/responses", {"model": "tiny-agent", "input": LONG}),
    "input_tokens": ("/v1/responses/input_tokens", {"model": "tiny-agent", "input": LONG}),
    "messages": ("/v1/messages", {"model": "tiny-agent", "max_tokens": 1, "messages": USER}),
    "count_tokens": ("/v1/messages/count_tokens", {"model": "tiny-agent", "messages": USER}),
    # a check that comes before preparation still comes first (n over the capacity, 3)
    "chat n": ("/v1/chat/completions", {"model": "tiny-agent", "messages": USER, "n": 4}),
    "unknown model": ("/v1/responses/input_tokens", {"model": "other", "input": LONG}),
}  # fmt: skip


@pytest.fixture(scope="module")
def client(tiny_agent: Path) -> Iterator[TestClient]:
    with app_client(tiny_agent, max_context=2048, max_concurrency=2, max_pending_requests=1) as c:
        yield c


def _service(client: TestClient) -> Any:
    return client.app.state.server.extra["service"]


def _post(client: TestClient, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = client.post(path, content=json.dumps(body, ensure_ascii=False).encode(),
                    headers={"content-type": "application/json"})  # fmt: skip
    out = r.json()
    out.pop("request_id", None)  # Anthropic bodies name the request
    return r.status_code, out


def _unscreened(client: TestClient, path: str, body: dict[str, Any]) -> tuple[int, dict]:
    service = _service(client)
    screen, service.body_screen = service.body_screen, None
    try:
        return _post(client, path, body)
    finally:
        service.body_screen = screen


@pytest.mark.parametrize("case", list(OVER))
def test_a_large_body_over_the_context_is_refused_as_the_server_refuses_it(client, case):
    path, body = OVER[case]
    screen = _service(client).body_screen
    before = screen.refused
    got = _post(client, path, body)
    assert got == _unscreened(client, path, body)
    if case == "unknown model":  # refused by validation, in the worker as in the server
        assert got[0] == 404 and screen.refused == before
        return
    assert screen.refused == before + 1
    code = "invalid_value" if case == "chat n" else "context_length_exceeded"
    assert got[0] == 400 and code in json.dumps(got[1])


def test_a_large_body_that_fits_is_prepared_by_the_server(client):
    """A long advisory field makes the body large but not the prompt: the worker proves
    nothing, the server prepares and generates as for any body."""
    screen = _service(client).body_screen
    before = screen.refused
    body = {"model": "tiny-agent", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2, "user": LONG}  # fmt: skip
    status, out = _post(client, "/v1/chat/completions", body)
    assert status == 200 and out["usage"]["completion_tokens"] >= 1
    assert screen.refused == before


def test_without_its_worker_the_server_prepares_large_bodies_itself(client):
    """A worker that dies mid-request is replaced on the next large body; the request it held
    is prepared in the server, with the same answer."""
    screen = _service(client).body_screen
    path, body = OVER["input_tokens"]
    expected = _post(client, path, body)  # a worker is running now
    screen._process.kill()
    screen._process.wait()
    refused = screen.refused
    assert _post(client, path, body) == expected
    assert screen.refused == refused and screen.failures == 1
    assert _post(client, path, body) == expected  # a new worker
    assert screen.refused == refused + 1 and screen.failures == 0


def test_a_closed_screen_leaves_large_bodies_to_the_server(client):
    """`ninfer serve` closes the screen when it stops: the worker is gone, and a large body
    that comes after is prepared in the server, with the same answer."""
    service = _service(client)
    running = service.body_screen
    screen = service.body_screen = BodyScreen(running.setup)
    try:
        path, body = OVER["count_tokens"]
        expected = _post(client, path, body)
        assert screen.refused == 1
        worker = screen._process
        screen.close()
        assert worker.poll() is not None and screen._process is None
        assert _post(client, path, body) == expected
        assert screen.refused == 1
    finally:
        service.body_screen = running

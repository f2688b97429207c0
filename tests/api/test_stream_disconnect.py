"""A streamed request whose client leaves while it waits for admission is cancelled then, not
when the engine admits it (docs/serving.md: a dead or unacknowledging peer is normally
cancelled within about 20 seconds, including while the request is waiting), and no stream was ever opened for it
(headers go out only at admission, docs/serving.md, "Streams and status codes"): the whole app over ASGI, with a
service whose generation waits for an admission that never comes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ninfer.api.server.app import create_app
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import GenerationEvent
from ninfer.api.wire.errors import CLIENT_CLOSED_STATUS
from tests.api.live_app import serve_config

MODEL = "tiny-model"


class QueuedForever:
    """A model service whose every generation waits in the queue until it is cancelled."""

    def __init__(self) -> None:
        self.closed: list[str] = []

    def generate(self, gen: Any, **kw: Any) -> AsyncIterator[GenerationEvent]:
        async def events() -> AsyncIterator[GenerationEvent]:
            try:
                await asyncio.Event().wait()
                yield  # type: ignore[misc]  # pragma: no cover
            finally:
                self.closed.append(gen.protocol)

        return events()


def _scope(path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }


BODIES = {
    "chat": (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        [],
    ),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}, []),
    "anthropic": (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        [(b"anthropic-version", b"2023-06-01")],
    ),
}


@pytest.mark.parametrize("protocol", sorted(BODIES))
def test_client_gone_before_the_stream_opens_cancels_the_queued_request(protocol):
    service = QueuedForever()
    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    state.extra["service"] = service
    app = create_app(state)
    path, payload, headers = BODIES[protocol]
    body = json.dumps(payload).encode()

    async def run() -> list[dict[str, Any]]:
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            return {"type": "http.disconnect"}  # the client left while its request waited

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(app(_scope(path, body, headers), receive, send), timeout=10)
        for _ in range(5):
            await asyncio.sleep(0)
        # checked while the loop runs: its shutdown would close every generator anyway
        assert service.closed == [protocol]
        return sent

    sent = asyncio.run(run())
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == CLIENT_CLOSED_STATUS  # no 200 stream was started for it

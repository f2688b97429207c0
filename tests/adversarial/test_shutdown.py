"""SIGTERM: requests still running when the shutdown grace period (5 s) is about to end are
ended by the server with 503 server_shutting_down - a stream with its protocol's final error
event, not a cut connection - and the log says the shutdown ended them (it used to say the
client cancelled, with a CancelledError traceback)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import AsyncIterator

import httpx

from ninfer.api.anthropic.sse import MessageStreamWriter
from ninfer.api.responses.endpoints import _create_sse, prepare
from ninfer.api.responses.request import parse_create_request
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import (
    Admitted,
    ContentText,
    Finished,
    GenerationEvent,
    Timings,
    Usage,
)
from ninfer.api.wire import errors
from ninfer.runtime.request import SamplingParams
from tests.adversarial.conftest import start_hostile
from tests.api.live_app import serve_config

MODEL = "tiny-agent"
GRACE_S = 5.0  # timeout_graceful_shutdown of `ninfer serve`


def test_a_stream_running_at_sigterm_ends_with_an_error_event(tmp_path):
    server = start_hostile(tmp_path, "--max-context", "8192")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                          timeout=60) as r:  # fmt: skip
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    try:
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert started.wait(30)
        t = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        reader.join(GRACE_S + 10)
        assert not reader.is_alive()
        assert time.monotonic() - t < GRACE_S + 3
        data = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
        assert "data: [DONE]" in lines[-3:]
        assert data[-1]["error"]["code"] == "server_shutting_down"
        server.process.wait(15)  # it exits
        log = server.stderr()
        assert "ended by the server's shutdown" in log
        assert "cancelled by the client" not in log and "Traceback" not in log
    finally:
        server.stop()


def shut_down(content: str = "Hel") -> list[GenerationEvent]:
    usage, timings = Usage(5, 1, 0, 0), Timings(0, 5, 1.0, 1, 1.0)
    return [
        Admitted(5, 0, "root"),
        ContentText(content),
        Finished("error", content, "", (), usage, timings, error=errors.server_shutting_down()),
    ]


def test_a_responses_stream_ended_by_the_shutdown_is_response_failed():
    state = ServerState(config=serve_config(max_context=4096), model_id=MODEL)
    req = parse_create_request(
        {"model": MODEL, "input": "Hi", "stream": True}, model_id=MODEL, vision=False
    )
    p = prepare(state, req)
    p.record_sampling(SamplingParams())  # as the service does before admission

    async def run() -> list[bytes]:
        async def events() -> AsyncIterator[GenerationEvent]:
            for e in shut_down()[1:]:
                yield e

        return [f async for f in _create_sse(state, p, shut_down()[0], events())]

    frames = asyncio.run(run())
    last = json.loads(frames[-1].split(b"data: ", 1)[1])
    assert last["type"] == "response.failed"
    assert last["response"]["error"]["code"] == "server_shutting_down"


def test_an_anthropic_stream_ended_by_the_shutdown_ends_with_an_error_event():
    writer = MessageStreamWriter(message_id="msg_1", model=MODEL, pending_timeout_ms=1000)
    frames = [f for e in shut_down() for f in writer.feed(e)]
    assert frames[-1].startswith("event: error")
    assert "shutting down" in frames[-1] and writer.ended

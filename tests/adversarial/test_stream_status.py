"""Streams open at admission (docs/serving.md, "Streams and status codes"): a streamed
request refused after waiting longer than the 5 s keep-alive interval still gets the refusal as
its HTTP status - 503 request_queue_timeout (Anthropic: 504), 400 context_length_exceeded - not
a 200 followed by an in-stream error. Against the real server: one long generation holds the
only lane while the others wait for --pending-timeout-ms (5.5 s)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

MODEL = "tiny-agent"
USER = [{"role": "user", "content": "hi"}]
STREAMS = {
    "chat": ("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True}, 503),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}, 503),
    "anthropic": (
        "/v1/messages",
        {"model": MODEL, "messages": USER, "max_tokens": 8, "stream": True},
        504,
    ),
}


def occupy_the_lane(base_url: str, stop: threading.Event) -> threading.Thread:
    """A streamed generation of up to 8000 tokens, read slowly until `stop`."""
    body = {"model": MODEL, "messages": USER, "max_tokens": 8000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    started = threading.Event()

    def run() -> None:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_bytes():
                started.set()
                if stop.is_set():
                    return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(30), "the occupying generation did not start"
    return t


def _post_timed(url: str, body: dict) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    r = httpx.post(url, json=body, timeout=60)
    return r, time.monotonic() - start


def test_queued_streams_refused_after_the_keepalive_interval_get_http_statuses(patient_server):
    stop = threading.Event()
    occupant = occupy_the_lane(patient_server.base_url, stop)
    try:
        # The three streams wait together (the server has 3 pending places beside its lane):
        # one 5.5 s wait instead of three in a row, and each is still timed on its own.
        with ThreadPoolExecutor(len(STREAMS)) as pool:
            futures = [
                (pool.submit(_post_timed, f"{patient_server.base_url}{path}", body), status)
                for path, body, status in STREAMS.values()
            ]
            replies = [(f.result(), status) for f, status in futures]
        for (r, waited), status in replies:
            assert waited > 5.0, "the request was not queued past the keep-alive interval"
            assert r.status_code == status, r.text
            assert r.headers["content-type"].startswith("application/json")
            text = json.dumps(r.json())
            assert "request_queue_timeout" in text or "timeout_error" in text
    finally:
        stop.set()
        occupant.join(30)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_a_prompt_over_the_context_is_400_not_an_in_stream_error(patient_server, name):
    path, body, _ = STREAMS[name]
    long_text = "The quick brown fox jumps over the lazy dog. " * 40_000  # ~1.8 MB
    if name == "responses":
        body = {**body, "input": long_text}
    else:
        body = {**body, "messages": [{"role": "user", "content": long_text}]}
    r = httpx.post(f"{patient_server.base_url}{path}", json=body, timeout=120)
    assert r.status_code == 400, r.text[:300]
    assert "context_length_exceeded" in r.text

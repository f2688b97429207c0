"""Request bodies cost bounded memory: unfinished uploads are held for at most the
outstanding-request capacity (max_concurrency + max_pending_requests) at --max-request-mib each,
and decoding one body costs at most ninfer.api.wire.body_cost.MAX_PARSE_FACTOR times its size
(denser JSON is refused before it is decoded)."""

from __future__ import annotations

import json
import socket
import time
import tracemalloc

import httpx
import pytest

from ninfer.api.wire import body_cost
from ninfer.api.wire.fields import parse_json_object
from tests.adversarial.conftest import MAX_BODY, PATIENT_CAPACITY, address, rss_bytes

MIB = 1 << 20
# bodies held at once: the capacity, plus one that reaches the service to get its logged 429
BODY_SLOTS = PATIENT_CAPACITY + 1
SLACK = 48 * MIB  # allocator, thread stacks, the few responses sent meanwhile


def start_upload(server, size: int) -> socket.socket:
    """A connection that sends the headers of a `size`-byte JSON POST and all but its last
    byte, then stalls (as much as the server reads within a moment)."""
    s = socket.create_connection(address(server), timeout=5)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    s.sendall(head)
    s.settimeout(0.5)
    body = memoryview(b"{" + b" " * (size - 2))
    sent = 0
    try:
        while sent < len(body):
            sent += s.send(body[sent : sent + MIB])
    except (TimeoutError, OSError):  # refused early: the server no longer reads
        pass
    return s


def test_unfinished_uploads_hold_at_most_the_capacity_in_memory(patient_server):
    """30 stalled uploads of ~8 MiB held +285 MiB before; now the capacity's worth of them are
    buffered and the others are answered 429 before their bodies are read."""
    pid = patient_server.process.pid
    before = rss_bytes(pid)
    conns = [start_upload(patient_server, MAX_BODY - 1) for _ in range(30)]
    try:
        time.sleep(1.0)
        grown = rss_bytes(pid) - before
        assert grown <= BODY_SLOTS * MAX_BODY + SLACK, f"+{grown / MIB:.0f} MiB"
        refused = 0
        for s in conns:
            s.settimeout(0.2)
            try:
                if b" 429 " in s.recv(4096).split(b"\r\n")[0]:
                    refused += 1
            except (TimeoutError, OSError):
                pass
        assert refused == len(conns) - BODY_SLOTS
        # /health needs no body slot: still served
        assert httpx.get(f"{patient_server.base_url}/health", timeout=5).status_code == 200
    finally:
        for s in conns:
            s.close()


def test_a_stalled_upload_is_answered_408_and_frees_its_slot(hostile_server):
    """--client-timeout-s 1: an upload that stops sending gets 408 request_timeout."""
    s = start_upload(hostile_server, 4 * MIB)
    try:
        s.settimeout(5)
        start = time.monotonic()
        reply = b""
        while b"request_timeout" not in reply and (chunk := s.recv(65536)):
            reply += chunk
        assert b" 408 " in reply.split(b"\r\n")[0] and b"request_timeout" in reply
        assert time.monotonic() - start < 4
    finally:
        s.close()
    # the slots are free again: a full request is served
    r = httpx.post(
        f"{hostile_server.base_url}/v1/chat/completions",
        json={
            "model": "tiny-agent",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
        },
        timeout=30,
    )
    assert r.status_code == 200


def dense(shape: bytes, size: int) -> bytes:
    """A JSON object whose member "x" is an array of `shape` repeated to about `size` bytes."""
    n = size // (len(shape) + 1)
    return b'{"x":[' + b",".join([shape] * n) + b"]}"


def parse_peak(raw: bytes) -> int:
    tracemalloc.start()
    try:
        parse_json_object(raw)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# Shapes as dense as a body can be that still pass the check, and shapes of real requests.
ACCEPTED = {
    "long string": b'"' + b"a" * 4096 + b'"',
    "emoji text": json.dumps("\U0001f600 text" * 200, ensure_ascii=False).encode(),
    "escaped text": json.dumps("\u00e9\n" * 500).encode(),
    "messages": b'{"role":"user","content":"' + b"hello there " * 8 + b'"}',
    "numbers in text": b'"' + b"1, 2, 3, " * 100 + b'"',
    "numbers": b"1000",
    "floats": b"1.5",
}
REFUSED = {
    "{}": b"{}",
    "[]": b"[]",
    "small objects": b'{"a":1}',
    "short strings": b'"ab"',
    "small ints": b"0",
    "short messages": b'{"role":"user","content":"hi"}',
}


@pytest.mark.parametrize("shape", list(ACCEPTED))
def test_decoding_costs_at_most_the_parse_factor(shape):
    raw = dense(ACCEPTED[shape], body_cost.EXEMPT_BYTES + 64 * 1024)  # judged, just
    peak = parse_peak(raw)
    assert peak <= body_cost.MAX_PARSE_FACTOR * len(raw), f"{peak / len(raw):.1f}x"
    assert body_cost.parse_cost(raw) >= peak  # the estimate errs high


@pytest.mark.parametrize("shape", list(REFUSED))
def test_denser_bodies_are_refused_before_decoding(shape):
    raw = dense(REFUSED[shape], 4 * MIB)
    tracemalloc.start()
    try:
        with pytest.raises(Exception) as e:
            parse_json_object(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert getattr(e.value, "code", None) == "request_too_complex"
    assert peak < MIB  # counted, not decoded


def test_the_estimate_bounds_what_the_refused_shapes_would_cost():
    for shape in REFUSED.values():
        raw = dense(shape, MIB // 8)  # small enough to decode (under EXEMPT_BYTES)
        assert body_cost.parse_cost(raw) >= parse_peak(raw)


def test_a_dense_body_is_400_over_http(hostile_server):
    raw = dense(b"{}", 6 * MIB)  # 48 MiB of this took 1.3 GiB before
    r = httpx.post(
        f"{hostile_server.base_url}/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_complex"

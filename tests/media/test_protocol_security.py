"""The media fetch boundary and the decoders, through the three protocols of a real --vision
server, without a packet beyond loopback (conftest.py's guard fails any other connect, and host
names resolve through a stub, never DNS).

- URLs whose name resolves to loopback, private, link-local, unique-local, metadata or
  IPv4-mapped addresses, and an allowed URL that redirects to a metadata address, are 400
  invalid_media naming the request field, before any connection (the loopback listener behind
  the refused names counts none).
- An oversize body is 400 media_budget_exceeded; a stalled body 504 media_fetch_timeout and an
  HTTP error answer 502 media_fetch_failed (the remote's fault: they keep their own server-side
  codes); a 20000x20000 PNG header is
  refused from the header (media_budget_exceeded); truncated and non-image bytes are 400
  invalid_media. None of them is a 500.
- Successful fetches go to a loopback server under --media-allow-private.
- --pending-timeout-ms covers media acquisition: a fetch that outlasts it is 503
  request_queue_timeout (Anthropic: 504 timeout_error).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from ninfer.media.fetch import FetchLimits
from tests.media.servers import LoopbackServer, StubResolver, dribble, redirect, send_bytes
from tests.media.test_image import png_header_only
from tests.media.vision_server import build_vision_artifact, vision_server

FORBIDDEN = {
    "loopback.test": "127.0.0.1",
    "loopback6.test": "::1",
    "ten.test": "10.1.2.3",
    "corp.test": "172.16.9.9",
    "home.test": "192.168.0.10",
    "linklocal.test": "169.254.10.10",
    "metadata.test": "169.254.169.254",
    "ula.test": "fd00::5",
    "mapped.test": "::ffff:127.0.0.1",
    "mapped-private.test": "::ffff:10.0.0.1",
}
PROTOCOLS = ("chat", "responses", "anthropic")


def small_png() -> bytes:
    rng = np.random.default_rng(3)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def request(protocol: str, url: str) -> tuple[str, dict[str, Any], str]:
    """(path, body, field of the image source) of a one-image request in `protocol`."""
    if protocol == "chat":
        part = {"type": "image_url", "image_url": {"url": url}}
        body = {
            "model": "tiny-vision-text",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}],
            "max_tokens": 1,
        }
        return "/v1/chat/completions", body, "messages[0].content[1].image_url.url"
    if protocol == "responses":
        content = [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": url}]
        body = {
            "model": "tiny-vision-text",
            "input": [{"role": "user", "content": content}],
            "max_output_tokens": 16,
        }
        return "/v1/responses", body, "input"
    block = {"type": "image", "source": {"type": "url", "url": url}}
    if url.startswith("data:"):
        media, data = url[5:].split(";base64,")
        block = {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    body = {
        "model": "x",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, block]}],
    }
    return "/v1/messages", body, "messages[0].content[1].source"


def error_of(protocol: str, response: httpx.Response) -> tuple[int, str, str | None]:
    """(status, code, param) of an error response in the protocol's own shape."""
    err = response.json()["error"]
    if protocol == "anthropic":
        details = err.get("details") or {}
        return response.status_code, details.get("error_code"), details.get("param")
    return response.status_code, err["code"], err.get("param")


@pytest.fixture(scope="module")
def listener() -> Iterator[LoopbackServer]:
    server = LoopbackServer("127.0.0.1")
    yield server
    server.close()


@pytest.fixture(scope="module")
def strict(fixture_root: Path, listener: LoopbackServer) -> Iterator[str]:
    """A server with the default fetch policy; every FORBIDDEN name resolves as listed."""
    resolver = StubResolver({name: [ip] for name, ip in FORBIDDEN.items()})
    with vision_server(build_vision_artifact(fixture_root), resolver) as (base, _):
        yield base


@pytest.fixture(scope="module")
def local(fixture_root: Path, listener: LoopbackServer) -> Iterator[str]:
    """A server with --media-allow-private, small fetch limits and a 3 s --pending-timeout-ms;
    "images.test" is the loopback listener, "meta.test" a metadata address (never opened by
    the option)."""
    resolver = StubResolver({"images.test": ["127.0.0.1"], "meta.test": ["169.254.169.254"]})
    limits = FetchLimits(max_bytes=64 * 1024, timeout_s=5.0, idle_timeout_s=0.5)
    artifact = build_vision_artifact(fixture_root)
    options = {"media_allow_private": True, "pending_timeout_ms": 3000}
    with vision_server(artifact, resolver, limits, **options) as (base, _):
        yield base


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("host", sorted(FORBIDDEN))
def test_forbidden_addresses_are_refused_before_any_connection(
    strict: str, listener: LoopbackServer, protocol: str, host: str
) -> None:
    listener.routes["/a.png"] = send_bytes(small_png())
    before = listener.connections
    path, body, field = request(protocol, f"http://{host}:{listener.port}/a.png")
    r = httpx.post(strict + path, json=body, timeout=30)
    assert error_of(protocol, r) == (400, "invalid_media", field), r.text
    assert FORBIDDEN[host].split(":")[-1] in r.text  # the message names the address
    assert listener.connections == before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_redirect_to_a_metadata_address_is_refused(
    local: str, listener: LoopbackServer, protocol: str
) -> None:
    listener.routes["/hop.png"] = redirect("http://meta.test/latest/meta-data/")
    path, body, field = request(protocol, f"http://images.test:{listener.port}/hop.png")
    r = httpx.post(local + path, json=body, timeout=30)
    assert error_of(protocol, r) == (400, "invalid_media", field), r.text
    assert "169.254.169.254" in r.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_allowed_loopback_fetch_is_served(
    local: str, listener: LoopbackServer, protocol: str
) -> None:
    listener.routes["/ok.png"] = send_bytes(small_png())
    path, body, _ = request(protocol, f"http://images.test:{listener.port}/ok.png")
    r = httpx.post(local + path, json=body, timeout=60)
    assert r.status_code == 200, r.text


# (route, status, code): the body a loopback server sends, and what each protocol answers
BODIES: dict[str, tuple[Any, int, str]] = {
    "oversize": (send_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * (128 * 1024)), 400, "media_budget_exceeded"),
    "slow": (dribble(b"\x89PNG\r\n\x1a\n", pause_s=2.0, pieces=3), 504, "media_fetch_timeout"),
    "bomb": (send_bytes(png_header_only(20000, 20000)), 400, "media_budget_exceeded"),
    "truncated": (send_bytes(small_png()[:60]), 400, "invalid_media"),
    "not-an-image": (send_bytes(b"<html>hello</html>", "text/html"), 400, "invalid_media"),
    "missing": (None, 502, "media_fetch_failed"),  # the listener answers 404
}  # fmt: skip


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", sorted(BODIES))
def test_bad_bodies_get_their_error_never_a_500(
    local: str, listener: LoopbackServer, protocol: str, case: str
) -> None:
    route, status, code = BODIES[case]
    if route is not None:
        listener.routes[f"/{case}"] = route
    path, body, field = request(protocol, f"http://images.test:{listener.port}/{case}")
    r = httpx.post(local + path, json=body, timeout=60)
    assert error_of(protocol, r) == (status, code, field), r.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("data", "code"),
    [
        (png_header_only(20000, 20000), "media_budget_exceeded"),
        (small_png()[:60], "invalid_media"),
        (b"GIF89a not really", "invalid_media"),
    ],
)
def test_bad_data_uris_get_their_error(local: str, protocol: str, data: bytes, code: str) -> None:
    uri = f"data:image/png;base64,{base64.b64encode(data).decode()}"
    path, body, field = request(protocol, uri)
    r = httpx.post(local + path, json=body, timeout=60)
    assert error_of(protocol, r) == (400, code, field), r.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_pending_timeout_covers_media_acquisition(
    local: str, listener: LoopbackServer, protocol: str
) -> None:
    # a body that never stalls long enough for the fetch's idle timeout, but outlasts the
    # request's admission deadline
    listener.routes["/trickle.png"] = dribble(b"\x89PNG\r\n\x1a\n", pause_s=0.2, pieces=40)
    path, body, _ = request(protocol, f"http://images.test:{listener.port}/trickle.png")
    r = httpx.post(local + path, json=body, timeout=60)
    status = 504 if protocol == "anthropic" else 503  # Anthropic's timeout_error
    assert error_of(protocol, r)[:2] == (status, "request_queue_timeout"), r.text

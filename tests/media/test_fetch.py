"""The media fetch boundary, tested without a packet beyond loopback (see conftest.py).

Refusals: a URL whose name resolves to a loopback, private, link-local, unique-local or
IPv4-mapped address, and a URL whose answer redirects to one, are refused with invalid_media
before any connection (the loopback listener counts none). Limits: oversize, stalled and
dribbling bodies. Successes go to a loopback server that the policy explicitly allows.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from ninfer.media import errors
from ninfer.media.addresses import FetchPolicy
from ninfer.media.fetch import FetchLimits, HttpFetcher
from ninfer.media.source import acquire
from tests.media.servers import (
    LoopbackServer,
    NetworkGuard,
    StubResolver,
    dribble,
    redirect,
    send_bytes,
    send_undeclared,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"payload" * 10
LOOPBACK_ONLY = FetchPolicy(allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def expect(code: str, coro: Any) -> errors.MediaError:
    with pytest.raises(errors.MediaError) as info:
        run(coro)
    assert info.value.code == code, info.value
    return info.value


def test_the_guard_sees_the_fetcher_s_connections(
    no_outside_network: NetworkGuard, loopback: Callable[..., LoopbackServer]
) -> None:
    # Proven on a loopback address the guard is told to treat as outside, so that a guard that
    # missed the connection would still send nothing beyond loopback.
    server = loopback("127.0.0.3")
    server.routes["/a.png"] = send_bytes(PNG)
    no_outside_network.also_forbidden.add("127.0.0.3")
    fetcher = HttpFetcher(FetchPolicy(allow_private=True))
    expect(errors.MEDIA_FETCH_FAILED, fetcher.fetch(server.url("/a.png")))
    assert no_outside_network.attempts == [("127.0.0.3", server.port)]
    assert server.connections == 0
    no_outside_network.attempts.clear()


FORBIDDEN = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "10.0.0.7",
    "172.16.5.4",
    "172.31.0.1",
    "192.168.1.20",
    "169.254.169.254",
    "169.254.10.10",
    "fd00::1",
    "fd12:3456::9",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:192.168.0.1",
]


@pytest.mark.parametrize("address", FORBIDDEN)
def test_names_resolving_to_forbidden_addresses_are_refused_before_connecting(
    address: str, loopback: Callable[..., LoopbackServer]
) -> None:
    server = loopback()
    server.routes["/a.png"] = send_bytes(PNG)
    resolver = StubResolver({"media.example": [address]})
    fetcher = HttpFetcher(resolver=resolver)
    err = expect(errors.INVALID_MEDIA, fetcher.fetch(server.url("/a.png", "media.example")))
    assert str(ipaddress.ip_address(address)) in err.message and "media.example" in err.message
    assert err.status == 400 and err.client_error
    assert resolver.lookups == ["media.example"]
    assert server.connections == 0
    assert fetcher.stats.refused == 1


def test_one_forbidden_address_among_public_ones_refuses_the_name(
    loopback: Callable[..., LoopbackServer],
) -> None:
    server = loopback()
    resolver = StubResolver({"mixed.example": ["93.184.216.34", "10.0.0.1"]})
    expect(
        errors.INVALID_MEDIA,
        HttpFetcher(resolver=resolver).fetch(server.url("/x", "mixed.example")),
    )
    assert server.connections == 0


@pytest.mark.parametrize("literal", ["127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "2130706433"])
def test_literal_and_numeric_hosts_are_vetted_too(
    literal: str, loopback: Callable[..., LoopbackServer]
) -> None:
    server = loopback()
    # "2130706433" is 127.0.0.1 spelled as a number: the resolver's answer is what is judged.
    resolver = StubResolver({"2130706433": ["127.0.0.1"]})
    expect(errors.INVALID_MEDIA, HttpFetcher(resolver=resolver).fetch(server.url("/", literal)))
    assert server.connections == 0


@pytest.mark.parametrize(
    "target",
    [
        "http://internal.example:{port_b}/b.png",
        "http://10.1.2.3/b.png",
        "http://[fd00::5]/",
        "http://[::ffff:192.168.0.1]:{port_b}/",
        "http://127.0.0.2:{port_b}/b.png",
    ],
)
def test_a_redirect_to_a_forbidden_address_is_refused_before_connecting(
    target: str, loopback: Callable[..., LoopbackServer]
) -> None:
    first = loopback("127.0.0.1")
    second = loopback("127.0.0.2")
    second.routes["/b.png"] = send_bytes(PNG)
    first.routes["/a.png"] = redirect(target.format(port_b=second.port))
    resolver = StubResolver({"public.example": ["127.0.0.1"], "internal.example": ["127.0.0.2"]})
    fetcher = HttpFetcher(policy=LOOPBACK_ONLY, resolver=resolver)
    err = expect(errors.INVALID_MEDIA, fetcher.fetch(first.url("/a.png", "public.example")))
    assert "refused" in err.message
    assert first.connections == 1
    assert second.connections == 0


def test_fetch_from_an_allowed_loopback_server_pins_the_address_and_keeps_the_host(
    loopback: Callable[..., LoopbackServer],
) -> None:
    server = loopback()
    server.routes["/a.png"] = send_bytes(PNG)

    class Rebinding(StubResolver):
        """Answers loopback once, then a private address: a second lookup would be an attack."""

        async def __call__(self, host: str, port: int) -> list[Any]:
            answer = await super().__call__(host, port)
            self.table[host] = [ipaddress.ip_address("10.9.9.9")]
            return answer

    resolver = Rebinding({"images.example": ["127.0.0.1"]})
    fetcher = HttpFetcher(policy=FetchPolicy(allow_private=True), resolver=resolver)
    fetched = run(fetcher.fetch(server.url("/a.png", "images.example")))
    assert fetched.data == PNG
    assert fetched.content_type == "image/png"
    assert resolver.lookups == ["images.example"]
    assert server.requests == [("/a.png", f"images.example:{server.port}")]
    assert fetcher.stats.snapshot()["bytes"] == len(PNG)


def test_international_names_are_resolved_and_sent_in_their_ascii_form(
    loopback: Callable[..., LoopbackServer],
) -> None:
    server = loopback()
    server.routes["/a.png"] = send_bytes(PNG)
    resolver = StubResolver({"xn--bcher-kva.example": ["127.0.0.1"]})
    fetcher = HttpFetcher(LOOPBACK_ONLY, resolver=resolver)
    assert run(fetcher.fetch(server.url("/a.png", "bücher.example"))).data == PNG
    assert server.requests == [("/a.png", f"xn--bcher-kva.example:{server.port}")]


def test_redirects_are_followed_within_the_cap(loopback: Callable[..., LoopbackServer]) -> None:
    server = loopback()
    server.routes["/final.png"] = send_bytes(PNG)
    server.routes["/r1"] = redirect("/final.png", 301)
    for i in range(2, 5):
        server.routes[f"/r{i}"] = redirect(f"/r{i - 1}", 307)
    fetcher = HttpFetcher(policy=LOOPBACK_ONLY, limits=FetchLimits(max_redirects=4))
    fetched = run(fetcher.fetch(server.url("/r4")))
    assert fetched.data == PNG and fetched.redirects == 4
    tight = HttpFetcher(policy=LOOPBACK_ONLY, limits=FetchLimits(max_redirects=3))
    err = expect(errors.MEDIA_FETCH_FAILED, tight.fetch(server.url("/r4")))
    assert "more than 3" in err.message


def test_oversize_bodies_exceed_the_budget(loopback: Callable[..., LoopbackServer]) -> None:
    server = loopback()
    server.routes["/declared"] = send_bytes(b"x" * 5000)
    server.routes["/undeclared"] = send_undeclared(b"x" * 5000)
    fetcher = HttpFetcher(policy=LOOPBACK_ONLY, limits=FetchLimits(max_bytes=4096))
    err = expect(errors.MEDIA_BUDGET_EXCEEDED, fetcher.fetch(server.url("/declared")))
    assert "5000 bytes" in err.message and "4096" in err.message
    expect(errors.MEDIA_BUDGET_EXCEEDED, fetcher.fetch(server.url("/undeclared")))


def test_a_stalled_body_times_out(loopback: Callable[..., LoopbackServer]) -> None:
    server = loopback()
    server.routes["/stall"] = dribble(b"\x89PNG", pause_s=5.0, pieces=1)
    limits = FetchLimits(idle_timeout_s=0.3, timeout_s=10)
    err = expect(
        errors.MEDIA_FETCH_TIMEOUT,
        HttpFetcher(policy=LOOPBACK_ONLY, limits=limits).fetch(server.url("/stall")),
    )
    assert err.status == 504 and "stalled" in err.message


def test_a_dribbling_body_hits_the_total_deadline(loopback: Callable[..., LoopbackServer]) -> None:
    server = loopback()
    server.routes["/drip"] = dribble(b"\x89PNG", pause_s=0.05)
    limits = FetchLimits(idle_timeout_s=1.0, timeout_s=0.5)
    fetcher = HttpFetcher(policy=LOOPBACK_ONLY, limits=limits)
    err = expect(errors.MEDIA_FETCH_TIMEOUT, fetcher.fetch(server.url("/drip")))
    assert "longer than 0.5 s" in err.message
    assert fetcher.stats.timeouts == 1


def test_remote_errors_are_fetch_failures(loopback: Callable[..., LoopbackServer]) -> None:
    server = loopback()
    server.routes["/gz"] = send_bytes(b"\x1f\x8b...", Content_Encoding="gzip")
    fetcher = HttpFetcher(policy=LOOPBACK_ONLY)
    err = expect(errors.MEDIA_FETCH_FAILED, fetcher.fetch(server.url("/missing")))
    assert "HTTP 404" in err.message and err.status == 502
    expect(errors.MEDIA_FETCH_FAILED, fetcher.fetch(server.url("/gz")))
    resolver = StubResolver({})
    err = expect(
        errors.MEDIA_FETCH_FAILED, HttpFetcher(resolver=resolver).fetch("http://nowhere.example/")
    )
    assert "nowhere.example" in err.message


def test_connection_refused_is_a_fetch_failure(loopback: Callable[..., LoopbackServer]) -> None:
    server = loopback()
    port = server.port
    server.close()
    expect(
        errors.MEDIA_FETCH_FAILED,
        HttpFetcher(policy=LOOPBACK_ONLY).fetch(f"http://127.0.0.1:{port}/"),
    )


@pytest.mark.parametrize(
    "source",
    [
        "file:///etc/passwd",
        "ftp://example.com/a.png",
        "/etc/passwd",
        "gopher://127.0.0.1/",
        "http://user:secret@example.com/a.png",
        "http:///nohost",
    ],
)
def test_other_schemes_and_bad_urls_are_invalid_media(source: str) -> None:
    fetcher = HttpFetcher(resolver=StubResolver({}))
    err = expect(errors.INVALID_MEDIA, acquire(source, "image", fetcher))
    assert err.status == 400


def test_data_uris() -> None:
    fetcher = HttpFetcher(limits=FetchLimits(max_bytes=100))
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode()
    acquired = run(acquire(uri, "image", fetcher))
    assert acquired.data == PNG and acquired.source == "data" and acquired.media_type == "image/png"
    wrapped = "data:image/png;base64," + "\n".join(
        base64.b64encode(PNG).decode()[i : i + 20] for i in range(0, 100, 20)
    )
    assert run(acquire(wrapped, "image", fetcher)).data == PNG[:75]
    for bad, word in [
        ("data:image/png," + PNG.decode("latin-1"), "base64"),
        ("data:text/html;base64,PGI+", "media type"),
        ("data:video/mp4;base64,AAAA", "media type"),
        ("data:image/png;base64,@@@@", "base64"),
        ("data:image/png;base64", "','"),
    ]:
        err = expect(errors.INVALID_MEDIA, acquire(bad, "image", fetcher))
        assert word in err.message, (bad, err.message)
    big = "data:image/png;base64," + base64.b64encode(b"x" * 200).decode()
    expect(errors.MEDIA_BUDGET_EXCEEDED, acquire(big, "image", fetcher))
    video = "data:video/mp4;base64," + base64.b64encode(b"....").decode()
    assert run(acquire(video, "video", fetcher)).data == b"...."


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for images.example (cert path, key path), made with openssl."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=images.example", "-addext", "subjectAltName=DNS:images.example",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


def test_https_connects_to_the_vetted_address_with_the_name_for_sni_and_certificate(
    certificate: tuple[str, str], loopback: Callable[..., LoopbackServer]
) -> None:
    cert, key = certificate
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_tls.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    server = loopback(tls=server_tls)
    server.routes["/a.png"] = send_bytes(PNG)
    trust = ssl.create_default_context(cafile=cert)
    resolver = StubResolver({"images.example": ["127.0.0.1"], "other.example": ["127.0.0.1"]})
    fetcher = HttpFetcher(LOOPBACK_ONLY, resolver=resolver, ssl_context=trust)
    fetched = run(fetcher.fetch(server.url("/a.png", "images.example")))
    assert fetched.data == PNG
    assert sni == ["images.example"]
    assert server.requests == [("/a.png", f"images.example:{server.port}")]
    # The same address under a name the certificate does not carry: verification fails.
    err = expect(errors.MEDIA_FETCH_FAILED, fetcher.fetch(server.url("/a.png", "other.example")))
    assert "other.example" in err.message
    assert len(server.requests) == 1

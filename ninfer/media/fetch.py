"""Fetching media over HTTP(S): the server-side request forgery boundary.

`HttpFetcher.fetch(url)` downloads one client-supplied URL under these rules:

- Only ``http`` and ``https``, no credentials in the URL.
- The host name is resolved first (through an injectable resolver), and *every* address it
  resolves to is judged by `addresses.refusal`; one refused address refuses the URL, before any
  connection is made. The connection then goes to a vetted address (the IP is pinned in the
  request URL) while the ``Host`` header and the TLS SNI / certificate check keep the name, so a
  second DNS answer (rebinding) can never redirect the connection.
- Redirects are not followed by the HTTP client: each ``Location`` is resolved and vetted the same
  way, up to `FetchLimits.max_redirects` hops.
- No proxy from the environment (a proxy would connect on our behalf to an unvetted address), no
  cookies, no connection reuse across hops, ``Accept-Encoding: identity`` (a compressed answer is
  refused rather than inflated without a bound).
- The body is capped at `FetchLimits.max_bytes` (the declared Content-Length is checked first);
  a body that stalls for `idle_timeout_s` or a fetch that runs past `timeout_s` in total fails.

Errors are `MediaError`s: a refused or malformed URL is ``invalid_media``; too many bytes is
``media_budget_exceeded``; an unreachable server or an HTTP error status is
``media_fetch_failed``; slowness is ``media_fetch_timeout``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from ninfer.media import errors
from ninfer.media.addresses import FetchPolicy, IPAddress, describe, parse_ip, refusal

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORT = {"http": 80, "https": 443}


@dataclass(frozen=True)
class FetchLimits:
    """Bounds on one fetch. Units: bytes and seconds.

    max_bytes: the largest body accepted. max_redirects: redirect hops followed.
    timeout_s: the whole fetch, DNS and redirects included. idle_timeout_s: the longest wait for
    the connection or for the next piece of the body (a stalled or dribbling server).
    """

    max_bytes: int = 64 << 20
    max_redirects: int = 5
    timeout_s: float = 30.0
    idle_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_redirects < 0:
            raise ValueError(f"invalid fetch limits {self}")
        if self.timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError(f"invalid fetch timeouts {self}")


@dataclass(frozen=True)
class Fetched:
    """One fetched body. url: the final URL after redirects; content_type: as the server said."""

    data: bytes
    url: str
    content_type: str | None
    redirects: int
    seconds: float


class FetchStats:
    """Process-wide fetch counters (thread-safe, monotonic), for an exporter to read.

    fetches / failures / timeouts: fetch outcomes (failures: every error but a timeout);
    refused: URLs refused for an address the policy forbids; bytes: body bytes received;
    seconds: wall time spent fetching. The request log's acquisition fields are per request
    (`preparer.request_log_fields`, from each item's own timing), never deltas of these; under
    /metrics the seconds would feed ninfer_host_work_seconds_total{phase="media_fetch"} once
    docs/serving.md lists that phase.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fetches = 0
        self.failures = 0
        self.timeouts = 0
        self.refused = 0
        self.bytes = 0
        self.seconds = 0.0

    def record(self, *, outcome: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.fetches += 1
            self.bytes += nbytes
            self.seconds += seconds
            if outcome == "failure":
                self.failures += 1
            elif outcome == "timeout":
                self.timeouts += 1

    def count_refused(self) -> None:
        with self._lock:
            self.refused += 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {
                "fetches": self.fetches,
                "failures": self.failures,
                "timeouts": self.timeouts,
                "refused": self.refused,
                "bytes": self.bytes,
                "seconds": self.seconds,
            }


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The operating system's resolver (getaddrinfo), every TCP address in its order."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        ip = parse_ip(str(sockaddr[0]))
        if ip is not None and ip not in out:
            out.append(ip)
    return out


class HttpFetcher:
    """Fetches http(s) URLs under a `FetchPolicy` and `FetchLimits` (see the module docstring).

    resolver: host, port -> addresses (tests inject a stub; the default asks the system).
    ssl_context: the trust store for https (default: certifi's CA bundle, as httpx uses).
    Safe to share between concurrent requests; `stats` accumulates over all of them.
    """

    def __init__(
        self,
        policy: FetchPolicy | None = None,
        limits: FetchLimits | None = None,
        resolver: Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.policy = policy or FetchPolicy()
        self.limits = limits or FetchLimits()
        self.resolver: Resolver = resolver or system_resolver
        self.stats = FetchStats()
        self._ssl = ssl_context

    async def fetch(self, url: str) -> Fetched:
        """The body of `url`, or a `MediaError` (see the module docstring for which code)."""
        start = time.monotonic()
        received = 0
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                fetched = await self._follow(url, start)
            received = len(fetched.data)
        except TimeoutError:
            self.stats.record(outcome="timeout", nbytes=0, seconds=time.monotonic() - start)
            raise errors.fetch_timeout(
                f"fetching {_short(url)} took longer than {self.limits.timeout_s:g} s"
            ) from None
        except errors.MediaError as e:
            outcome = "timeout" if e.code == errors.MEDIA_FETCH_TIMEOUT else "failure"
            self.stats.record(outcome=outcome, nbytes=0, seconds=time.monotonic() - start)
            raise
        self.stats.record(outcome="ok", nbytes=received, seconds=time.monotonic() - start)
        return fetched

    async def _follow(self, url: str, start: float) -> Fetched:
        current = _parse(url)
        for hop in range(self.limits.max_redirects + 1):
            response_or_next = await self._hop(current)
            if isinstance(response_or_next, httpx.URL):
                current = response_or_next
                continue
            data, content_type = response_or_next
            return Fetched(data, str(current), content_type, hop, time.monotonic() - start)
        raise errors.fetch_failed(
            f"fetching {_short(url)} was redirected more than {self.limits.max_redirects} times"
        )

    async def _vetted(self, url: httpx.URL) -> list[IPAddress]:
        host = url.raw_host.decode("ascii")  # IDNA-encoded: what DNS, SNI and Host carry
        port = url.port or _DEFAULT_PORT[url.scheme]
        literal = parse_ip(host)
        if literal is not None:
            addresses: Sequence[IPAddress] = [literal]
        else:
            try:
                addresses = await self.resolver(host, port)
            except OSError as e:
                raise errors.fetch_failed(f"cannot resolve the media host {host!r}: {e}") from e
            if not addresses:
                raise errors.fetch_failed(f"the media host {host!r} has no address")
        for ip in addresses:
            why = refusal(ip, self.policy)
            if why is not None:
                self.stats.count_refused()
                raise errors.invalid_media(
                    f"the media URL host {host!r} resolves to {describe(ip)} ({why}); fetching from "
                    "loopback, private, link-local, multicast, metadata or reserved addresses "
                    "is refused"
                )
        return list(addresses)

    async def _hop(self, url: httpx.URL) -> httpx.URL | tuple[bytes, str | None]:
        """One request: the next URL for a redirect, else (body, content type)."""
        addresses = await self._vetted(url)
        last: Exception | None = None
        for ip in addresses:
            try:
                return await self._request(url, ip)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                last = e  # try the next vetted address, as a browser would
        assert last is not None
        if isinstance(last, httpx.ConnectTimeout):
            raise errors.fetch_timeout(f"connecting to the media host {url.host!r} timed out")
        raise errors.fetch_failed(f"cannot connect to the media host {url.host!r}: {last}")

    async def _request(self, url: httpx.URL, ip: IPAddress) -> httpx.URL | tuple[bytes, str | None]:
        limits = self.limits
        pinned = url.copy_with(host=str(ip))
        default_port = url.port is None or url.port == _DEFAULT_PORT[url.scheme]
        name = url.raw_host.decode("ascii")  # IDNA-encoded
        bracketed = f"[{name}]" if ":" in name else name  # an IPv6 literal keeps its brackets
        host_header = bracketed if default_port else f"{bracketed}:{url.port}"
        extensions = {"sni_hostname": name} if url.scheme == "https" else {}
        timeout = httpx.Timeout(limits.idle_timeout_s)
        async with httpx.AsyncClient(
            verify=self._ssl_context() if url.scheme == "https" else False,
            trust_env=False,
            follow_redirects=False,
            timeout=timeout,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as client:
            request = client.build_request(
                "GET",
                pinned,
                headers={
                    "Host": host_header,
                    "Accept": "image/*, video/*;q=0.9, */*;q=0.5",
                    "Accept-Encoding": "identity",
                    "User-Agent": "ninfer-media-fetch",
                },
                extensions=extensions,
            )
            try:
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                raise  # _hop tries the next vetted address
            except httpx.TimeoutException as e:
                raise errors.fetch_timeout(
                    f"the media host {url.host!r} sent no answer within {limits.idle_timeout_s:g} s"
                ) from e
            except httpx.HTTPError as e:
                raise errors.fetch_failed(f"fetching from {url.host!r} failed: {e}") from e
            try:
                return await self._answer(url, response)
            finally:
                await response.aclose()

    async def _answer(
        self, url: httpx.URL, response: httpx.Response
    ) -> httpx.URL | tuple[bytes, str | None]:
        limits = self.limits
        if response.status_code in _REDIRECTS:
            location = response.headers.get("location")
            if not location:
                raise errors.fetch_failed(
                    f"{url.host!r} answered HTTP {response.status_code} without a Location"
                )
            try:
                return _parse(str(url.join(location)))
            except errors.MediaError as e:
                raise errors.invalid_media(f"the media URL redirects to a refused URL: {e}") from e
            except httpx.InvalidURL as e:
                raise errors.invalid_media(f"the media URL redirects to a bad URL: {e}") from e
        if response.status_code != 200:
            raise errors.fetch_failed(
                f"the media URL answered HTTP {response.status_code} (host {url.host!r})"
            )
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise errors.fetch_failed(
                f"the media host {url.host!r} sent a {encoding!r}-encoded body; only "
                "uncompressed bodies are accepted"
            )
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
            raise errors.budget_exceeded(
                f"the media at {url.host!r} is {int(declared)} bytes, more than the limit of "
                f"{limits.max_bytes} bytes"
            )
        body = bytearray()
        try:
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > limits.max_bytes:
                    raise errors.budget_exceeded(
                        f"the media at {url.host!r} is larger than the limit of "
                        f"{limits.max_bytes} bytes"
                    )
        except httpx.TimeoutException as e:
            raise errors.fetch_timeout(
                f"the media body from {url.host!r} stalled for more than "
                f"{limits.idle_timeout_s:g} s"
            ) from e
        except httpx.HTTPError as e:
            raise errors.fetch_failed(f"reading the media from {url.host!r} failed: {e}") from e
        return bytes(body), response.headers.get("content-type")

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import certifi  # httpx's own CA bundle

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl


def _parse(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as e:
        raise errors.invalid_media(f"the media URL is not a valid URL: {e}") from e
    if parsed.scheme not in _DEFAULT_PORT:
        raise errors.invalid_media(
            f"media URLs must be http(s) or data: URIs, not {parsed.scheme or 'scheme-less'!r}"
        )
    if not parsed.host:
        raise errors.invalid_media("the media URL has no host")
    if parsed.userinfo:
        raise errors.invalid_media("media URLs with credentials (user:password@) are refused")
    return parsed


def _short(url: str) -> str:
    return url if len(url) <= 100 else url[:97] + "..."

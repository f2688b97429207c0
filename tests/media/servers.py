"""Loopback HTTP servers, a stub resolver and the network guard of the media tests.

`LoopbackServer` serves per-path behaviours on a loopback address and counts the connections it
accepted, so a test can prove that a refused URL never reached it. `StubResolver` answers host
names from a table, so no test ever asks DNS.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ninfer.media.addresses import IPAddress


class NetworkGuard:
    """Records connects to addresses outside loopback (and to `also_forbidden`, which lets a
    test prove the guard sees the code's connections without anything leaving loopback)."""

    def __init__(self) -> None:
        self.attempts: list[Any] = []
        self.also_forbidden: set[str] = set()

    def allows(self, address: Any) -> bool:
        if not isinstance(address, tuple) or not address:
            return False
        host = str(address[0]).split("%")[0]
        if host in self.also_forbidden:
            return False
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False  # a host name: the code under test must never hand one to connect

    def check(self, address: Any) -> None:
        if not self.allows(address):
            self.attempts.append(address)
            raise PermissionError(f"test guard: connection to {address} refused")


class StubResolver:
    """host -> addresses from a table; records every lookup. Unknown names fail like NXDOMAIN."""

    def __init__(self, table: dict[str, list[str]]):
        self.table = {h: [ipaddress.ip_address(a) for a in addrs] for h, addrs in table.items()}
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.table[host])


Route = Callable[[BaseHTTPRequestHandler], None]


class LoopbackServer:
    """A threaded HTTP server on a loopback address with per-path behaviours.

    `routes[path](handler)` answers a GET; `connections` counts accepted TCP connections and
    `requests` records (path, Host header) of each request.
    """

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
        self.routes: dict[str, Route] = {}
        self.connections = 0
        self.requests: list[tuple[str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append((self.path, self.headers.get("Host")))
                route = owner.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the fetcher gave up, as the test wanted

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request: Any, client_address: Any) -> bool:
                owner.connections += 1
                return True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self.server = Server((host, 0), Handler)
        self.scheme = "http"
        if tls is not None:  # the handshake happens on accept, in the serving thread
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.host = host
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str, host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def send_bytes(body: bytes, content_type: str = "image/png", **headers: str) -> Route:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.end_headers()
        h.wfile.write(body)

    return route


def send_undeclared(body: bytes) -> Route:
    """A body without Content-Length (HTTP/1.0: it ends when the connection closes)."""

    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "image/png")
        h.end_headers()
        h.wfile.write(body)

    return route


def redirect(location: str, status: int = 302) -> Route:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return route


def dribble(first: bytes, pause_s: float, pieces: int = 1000) -> Route:
    """Declares a large body, sends `first`, then one byte every `pause_s` seconds."""

    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "image/png")
        h.send_header("Content-Length", str(len(first) + pieces))
        h.end_headers()
        h.wfile.write(first)
        h.wfile.flush()
        for _ in range(pieces):
            time.sleep(pause_s)
            h.wfile.write(b"x")
            h.wfile.flush()

    return route

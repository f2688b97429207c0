"""Fixtures of the media tests: a network guard, loopback HTTP servers and a stub resolver.

This machine must never send a packet beyond loopback, even by mistake, so every test in this
folder runs under `no_outside_network`: a connect to any address outside 127.0.0.0/8 and ::1
is recorded and refused, and the test fails at teardown if one was attempted. Host names are
resolved by `tests.media.servers.StubResolver`, never by DNS.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.media.servers import LoopbackServer, NetworkGuard


@pytest.fixture(autouse=True)
def no_outside_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkGuard]:
    """Refuse and record every connect to a non-loopback address; fail the test if any."""
    guard = NetworkGuard()
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_create = socket.create_connection
    inet = (socket.AF_INET, socket.AF_INET6)

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in inet:
            guard.check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in inet:
            guard.check(address)
        return real_connect_ex(self, address)

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        guard.check(address)
        return real_create(address, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    yield guard
    assert not guard.attempts, f"the code tried to reach non-loopback addresses: {guard.attempts}"


@pytest.fixture
def loopback() -> Iterator[Callable[..., LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def make(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> LoopbackServer:
        servers.append(LoopbackServer(host, tls))
        return servers[-1]

    yield make
    for s in servers:
        s.close()

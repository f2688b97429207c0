"""`ninfer serve`'s listening socket: keepalive and user timeout on accepted connections, a busy
port reported first (before the engine is built), no connection accepted before it listens."""

from __future__ import annotations

import socket
import sys

import pytest

from ninfer.commands import serve
from ninfer.errors import ConfigError

# -- the listening socket ------------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_USER_TIMEOUT is Linux-only")
def test_accepted_connections_inherit_keepalive_and_user_timeout():
    listener = serve.bound_socket("127.0.0.1", 0)
    serve.listen(listener)
    try:
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()
        try:
            assert conn.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert (
                conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                == serve.TCP_USER_TIMEOUT_MS
            )
            assert (
                conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
                == serve.TCP_KEEPALIVE_IDLE_S
            )
        finally:
            conn.close()
            client.close()
    finally:
        listener.close()


def test_bound_socket_reports_a_busy_port():
    first = serve.bound_socket("127.0.0.1", 0)
    serve.listen(first)
    try:
        port = first.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve.bound_socket("127.0.0.1", port)
    finally:
        first.close()


def test_bound_socket_refuses_connections_until_it_listens():
    sock = serve.bound_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(sock.getsockname(), timeout=5).close()
        serve.listen(sock)
        socket.create_connection(sock.getsockname(), timeout=5).close()
    finally:
        sock.close()


def test_busy_port_fails_before_the_engine_is_built(monkeypatch, capsys):
    """`serve` binds its port before the (slow) engine build and warm-up: a busy port is the
    first thing it reports, and nothing is built."""
    from ninfer.cli import main

    busy = serve.bound_socket("127.0.0.1", 0)
    serve.listen(busy)

    def build(*a, **k):
        raise AssertionError("the engine was built before the port was checked")

    monkeypatch.setattr(serve, "build_state", build)
    try:
        port = busy.getsockname()[1]
        assert main(["serve", "--host", "127.0.0.1", "--port", str(port)]) != 0
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    finally:
        busy.close()

"""The HTTP/1.1 server under the app: uvicorn's h11 protocol with connection hygiene.

uvicorn closes an idle keep-alive connection only after a response, and re-arms nothing while
a client trickles header bytes; a connection that never completes a request stays open forever,
and enough of them exhaust the process's file descriptors, after which `accept()` fails and even
`/health` goes unanswered. `GuardedH11Protocol` adds two rules:

- header timeout: a connection must complete a request's headers within --client-timeout-s of
  opening or of its previous response (so idle, never-used and slow-header connections are
  closed after that long); the body then has its own deadline (ninfer.api.server.app.BodyLimit);
- connection cap: at most `max_connections` are open (derived from RLIMIT_NOFILE, leaving room
  for the process's own files and the accept bursts in flight, `connection_limits`); a
  connection beyond it closes the longest-idle connection that has no request in progress
  (HTTP/1.1 lets a server close an idle connection at any time; clients retry), or is itself
  closed when every connection is busy. So `accept()` never runs out of descriptors and
  /health keeps answering.

It also turns Nagle's algorithm off on every TCP connection (TCP_NODELAY). asyncio does that
only for sockets whose `proto` is IPPROTO_TCP, and a listening socket made as
`socket.socket(AF_INET, SOCK_STREAM)` (ninfer serve's) has proto 0, so its connections kept
Nagle: a response is written as headers then body, the body waited for the client's delayed
ACK of the headers, and every request after the first on a keep-alive connection took 40+ ms
more (/health: 44 ms instead of 1 ms); a stream's small writes were exposed to the same wait.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

FD_RESERVE = 32  # descriptors kept free for the process itself (logs, files it opens later)
MIN_CONNECTIONS = 8
MAX_BACKLOG = 2048


def open_fds() -> int:
    """Descriptors this process has open now (Linux /proc; 0 where unknown)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def connection_limits(soft_limit: int | None = None, in_use: int | None = None) -> tuple[int, int]:
    """(listen backlog, connection cap) for the RLIMIT_NOFILE soft limit and the descriptors in
    use. asyncio accepts up to `backlog` connections in one burst per loop iteration, and a
    connection runs its `connection_made` two iterations after its accept (a task step makes
    the transport, which schedules it), where the cap closes idle connections, whose
    descriptors are released one iteration later still. Under a flood three bursts are open
    beyond the cap (the one whose victims are closing, and two not yet counted), so the cap
    leaves room for three: in_use + cap + 3 x backlog stays FD_RESERVE below the limit, and
    accept() never fails for want of a descriptor. (With room for one burst, 'accept() out of
    system resource' was logged in 2 of 6 floods of 600 connections under a 256 limit, and the
    300-connection test failed in 2 of ~10 suite runs; with room for three, in 0 of 6 floods.)"""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY:
        soft_limit = 1 << 20
    free = soft_limit - (open_fds() if in_use is None else in_use) - FD_RESERVE
    backlog = min(MAX_BACKLOG, max(MIN_CONNECTIONS, free // 4))
    return backlog, max(MIN_CONNECTIONS, free - 3 * backlog)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol plus the header timeout and the connection cap (module docstring).
    Configure through `guarded_protocol`, which sets the two class attributes."""

    header_timeout_s: float = 30.0
    max_connections: int = 1 << 20

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_since = time.monotonic()
        self._cycle_seen: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        no_delay(transport)
        super().connection_made(transport)
        self._arm()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and cycle is not self._cycle_seen and not cycle.response_complete:
            self._cycle_seen = cycle  # a request's headers are complete: it is in progress
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._idle_since = time.monotonic()
            self._arm()
            cycle = self.cycle  # a pipelined request may have started already
            if cycle is not None and cycle is not self._cycle_seen and not cycle.response_complete:
                self._cycle_seen = cycle
                self._disarm()

    # -- helpers ------------------------------------------------------------------------------

    def busy(self) -> bool:
        """Whether a request is in progress on this connection."""
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if not self.busy():
            self._close()

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> None:
        """Close idle connections, longest-idle first, until at most `max_connections` remain
        open (closing ones still sit in `connections` until their connection_lost runs); this
        one last, and only if no other is idle."""
        open_ = [c for c in self.connections if not _closing(c)]
        excess = len(open_) - self.max_connections
        if excess <= 0:
            return
        idle = sorted(
            (
                c
                for c in open_
                if isinstance(c, GuardedH11Protocol) and c is not self and not c.busy()
            ),
            key=lambda c: c._idle_since,
        )
        for c in idle[:excess]:
            c._close()
        if len(idle) < excess and not self.busy():
            self._close()


def no_delay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on `transport`'s socket when it is TCP (module docstring: why)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer is already gone: connection_lost follows
            pass


def _closing(protocol: Any) -> bool:
    transport = getattr(protocol, "transport", None)
    return transport is None or transport.is_closing()


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """A GuardedH11Protocol class with these limits (uvicorn instantiates it per connection)."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout_s": header_timeout_s, "max_connections": max_connections},
    )


STREAM_END_MARGIN_S = 1.0  # before the grace period ends, running requests are ended


# How long a thread that wants the GIL (the event loop, woken by a request) waits before the
# holder (a worker thread preparing a large prompt) is made to hand it over; CPython's default
# is 5 ms. Measured on the shared 2-core machine at load 8-9, /health on a server preparing
# maximal bodies, 12 requests each way: the worst /health 10-166 ms (median 22) with 1 ms,
# 21-317 ms (median 58) with 5 ms. A pure-Python thread beside a sleeping one: 1 ms sleeps
# woke 22-28 ms late at worst with 1 ms, 29-71 ms with 5 ms.
GIL_SWITCH_INTERVAL_S = 0.001


def freeze_startup_heap() -> None:
    """Collect, then move every object that exists now into the collector's permanent
    generation (gc.freeze), where full collections no longer walk it.

    Why: what exists when the server starts (modules, the model, the tokenizer, ~235k objects
    for the tiny test model) lives as long as the process, and a full collection walks all of
    it with the GIL held: 400-700 ms measured on the shared 2-core machine, a stall of the event
    loop (/health, every stream) that recurs whenever enough objects have outlived two younger
    collections. Frozen objects are still freed by reference counting; only cycles among them
    would wait for `gc.unfreeze`."""
    gc.collect()
    gc.freeze()


def graceful_server(config: Any, on_grace_end: Callable[[], object] | None) -> Any:
    """A uvicorn.Server whose shutdown (SIGTERM) calls `on_grace_end` STREAM_END_MARGIN_S before
    `timeout_graceful_shutdown` runs out: requests still running are then ended by the app
    (each stream with its protocol's final error event) and their connections close cleanly,
    where uvicorn would cancel their tasks, cut the streams and log a traceback. Its startup
    freezes the heap built so far (`freeze_startup_heap`) and sets the GIL switch interval to
    GIL_SWITCH_INTERVAL_S, for the event loop's latency while worker threads run."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            freeze_startup_heap()
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
            await super().startup(sockets)

        async def shutdown(self, sockets: Any = None) -> None:
            grace = self.config.timeout_graceful_shutdown
            timer = None
            if on_grace_end is not None and grace is not None:
                delay = max(0.0, grace - STREAM_END_MARGIN_S)
                timer = asyncio.get_running_loop().call_later(delay, on_grace_end)
            try:
                await super().shutdown(sockets)
            finally:
                if timer is not None:
                    timer.cancel()

    return GracefulServer(config)


def uvicorn_config(app: Any, *, client_timeout_s: float, log_level: str, **options: Any) -> Any:
    """The uvicorn.Config `ninfer serve` runs: the guarded h11 protocol, keep-alive and header
    timeouts of `client_timeout_s`, access log off, uvicorn's own logging config off."""
    import uvicorn

    backlog, cap = connection_limits()
    return uvicorn.Config(
        app,
        http=guarded_protocol(client_timeout_s, cap),
        backlog=backlog,
        timeout_keep_alive=max(1, round(client_timeout_s)),
        log_level=log_level,
        access_log=False,
        log_config=None,  # ninfer.api.observability.oplog formats uvicorn's records too
        **options,
    )

"""Fixtures of the adversarial suite: a real `ninfer serve` process on the committed tiny
trained model with small limits, so that each hostile pattern reaches its bound quickly.

`hostile_server` (one per session): 1 lane + 1 pending request (capacity 2), 8 MiB bodies,
--client-timeout-s 1. `start_hostile(tmp, *flags, rlimit_nofile=N)` starts another, optionally
under a lowered file-descriptor limit.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ROOT, TINY_AGENT, LiveServer, free_port

HOSTILE_FLAGS = (
    "--max-concurrency", "1", "--max-pending-requests", "1", "--max-request-mib", "8",
    "--client-timeout-s", "1", "--max-context", "2048", "--log-stats-interval-ms", "0",
)  # fmt: skip
CAPACITY = 2  # max_concurrency + max_pending_requests above
PATIENT_FLAGS = (
    "--client-timeout-s", "30", "--max-pending-requests", "3", "--max-context", "8192",
    "--pending-timeout-ms", "5500",
)  # fmt: skip
PATIENT_CAPACITY = 4
MAX_BODY = 8 << 20
_LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
    "sys.argv[0] = 'ninfer'; runpy.run_module('ninfer.cli', run_name='__main__')"
)


def start_hostile(
    tmp_dir: Path, *flags: str, rlimit_nofile: int | None = None, timeout_s: float = 120
) -> LiveServer:
    """`ninfer serve TINY_AGENT` with HOSTILE_FLAGS then `flags` (later ones win)."""
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    args = ["serve", str(TINY_AGENT), "--port", str(port), *HOSTILE_FLAGS, *flags]
    cmd = [sys.executable, "-m", "ninfer.cli", *args]
    if rlimit_nofile is not None:  # the server process lowers its own limit, then runs the CLI
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        cmd = [sys.executable, "-c", _LIMITED.format(soft=rlimit_nofile, hard=hard), *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return LiveServer(f"http://127.0.0.1:{port}", proc, log_path).wait_ready(timeout_s)


@pytest.fixture(scope="session")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_hostile(tmp_path_factory.mktemp("hostile"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def patient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """As hostile_server, but with --client-timeout-s 30 (slow uploads stay pending long enough
    to be measured), 3 pending requests (PATIENT_CAPACITY 4), --max-context 8192 (a long
    generation holds the lane) and --pending-timeout-ms 5500 (a queued request is refused
    after the 5 s keep-alive interval)."""
    server = start_hostile(tmp_path_factory.mktemp("patient"), *PATIENT_FLAGS)
    yield server
    server.stop()


def address(server: LiveServer) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def connect(server: LiveServer) -> socket.socket:
    s = socket.create_connection(address(server), timeout=5)
    return s


def is_closed(s: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether the peer has closed `s` (EOF or reset), waiting up to `wait_s`."""
    s.settimeout(wait_s if wait_s > 0 else 0.001)
    try:
        return s.recv(65536) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def health_ms(server: LiveServer, timeout_s: float = 10) -> float:
    t = time.perf_counter()
    r = httpx.get(f"{server.base_url}/health", timeout=timeout_s)
    assert r.status_code == 200
    return (time.perf_counter() - t) * 1000


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

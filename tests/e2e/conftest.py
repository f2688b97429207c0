"""End-to-end fixtures: the real `ninfer serve` process on the committed tiny trained model.

`live_server` starts one server for the whole session (CPU, float32) on a free port and yields
its base URL (`http://127.0.0.1:PORT`); `server_factory` starts servers with extra flags, one
set per test module. Servers
are real subprocesses driven over HTTP by the official clients, exactly as users run them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_AGENT = ROOT / "artifacts" / "fixtures" / "tiny-agent.ninfer"
STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    base_url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def model(self) -> str:
        return httpx.get(f"{self.base_url}/v1/models", headers=self.headers).json()["data"][0]["id"]

    headers: dict | None = None

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> LiveServer:
        """Returns once GET /health answers 200; raises RuntimeError (with the server's log)
        when the process exits first or `timeout_s` passes (the server is stopped then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"ninfer serve exited with {self.process.returncode}:\n{self.stderr()[-4000:]}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"ninfer serve did not become ready in {timeout_s}s:\n{self.stderr()[-4000:]}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(
    tmp_dir: Path,
    *args: str,
    artifact: Path | None = TINY_AGENT,
    api_key: str | None = None,
    env: dict | None = None,
) -> LiveServer:
    """Start `ninfer serve [artifact] --port P args...`; artifact None serves the demo model."""
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    positional = [] if artifact is None else [str(artifact)]
    cmd = [sys.executable, "-m", "ninfer.cli", "serve", *positional, "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log_path)
    if api_key:
        server.headers = {"Authorization": f"Bearer {api_key}"}
    return server.wait_ready()


# Session-wide: five modules use it, and each start costs 4-5 s of CI time; no test relies on
# a fresh server (prefix-cache hits, stored responses and metrics are asserted relative to the
# test's own requests), and an idle server takes no CPU.
@pytest.fixture(scope="session")
def live_server(tmp_path_factory) -> Iterator[LiveServer]:
    if not TINY_AGENT.exists():
        pytest.fail(f"{TINY_AGENT} is missing: build it with `python -m artifacts.train_tiny`")
    server = start_server(
        tmp_path_factory.mktemp("serve"), "--max-concurrency", "4", "--max-context", "2048"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory) -> Iterator:
    started: list[LiveServer] = []

    def make(*args: str, **kw) -> LiveServer:
        s = start_server(tmp_path_factory.mktemp("serve"), *args, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()

"""The real in-process server (engine, tokenizer, routes) behind a Litestar TestClient, or behind
uvicorn on a loopback port for the clients that speak only real HTTP, for the API tests that
drive whole requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from litestar.testing import TestClient

from ninfer.api.server.app import create_app
from ninfer.api.server.config import ServeConfig
from ninfer.artifact import Artifact
from ninfer.commands import serve
from ninfer.runtime.config import EngineOptions


def serve_config(**options: Any) -> ServeConfig:
    """A ServeConfig from keywords named like the `ninfer serve` flags, the server's and the
    engine's mixed (`max_context=4096, api_key="k"`)."""
    server = {k: v for k, v in options.items() if k in ServeConfig.__dataclass_fields__}
    engine = {k: v for k, v in options.items() if k not in server}
    return ServeConfig(**server, engine=EngineOptions.of(**engine))


@contextmanager
def app_client(artifact: Path, **options: Any) -> Iterator[TestClient]:
    """A client of `ninfer serve` on ``artifact`` with ServeConfig ``options`` (throughput logs
    off); the engine is closed when the block ends."""
    config = serve_config(artifact=str(artifact), log_stats_interval_ms=0, **options)
    state = serve.build_state(config, Artifact(artifact))
    try:
        with TestClient(app=create_app(state)) as c:
            yield c
    finally:
        state.engine.close()


@contextmanager
def uvicorn_url(app: Any, **config: Any) -> Iterator[str]:
    """The base URL of `app` served by uvicorn on 127.0.0.1 (a free port) in a thread, with
    uvicorn `config` keywords (log_level "warning" unless given); stopped when the block ends."""
    config.setdefault("log_level", "warning")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def live_url(artifact: Path, **options: Any) -> Iterator[str]:
    """The base URL of `ninfer serve` on ``artifact`` with ServeConfig ``options`` (throughput
    logs off) behind uvicorn; the engine is closed when the block ends."""
    config = serve_config(artifact=str(artifact), log_stats_interval_ms=0, **options)
    state = serve.build_state(config, Artifact(artifact))
    try:
        with uvicorn_url(create_app(state)) as url:
            yield url
    finally:
        state.engine.close()

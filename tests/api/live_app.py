"""The real in-process server (engine, tokenizer, routes) behind a Litestar TestClient, for the
API tests that drive whole requests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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

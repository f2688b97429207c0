"""A real --vision server for the protocol-level media tests.

`vision_server(artifact, resolver=...)` starts the real engine and service on the tiny Qwen3.5
vision-language fixture with --vision and the given media options, as `ninfer serve` does after
its startup checks: parsing, fetching, decoding, placing the placeholders, the spans on the
engine Request, and the vision tower and MRoPE of the CPU executor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from artifacts.fixture_vision import build_vision_fixture, vision_tokenizer
from ninfer.api.observability.metrics import route_handlers as metrics_routes
from ninfer.api.observability.request_log import RequestLog
from ninfer.api.observability.wiring import Observability
from ninfer.api.server.app import create_app
from ninfer.api.server.engine import start_engine
from ninfer.api.server.state import ServerState
from ninfer.artifact import Artifact
from ninfer.media.fetch import FetchLimits
from tests.api.live_app import serve_config, uvicorn_url

__all__ = ["build_vision_artifact", "vision_server", "vision_tokenizer"]


def build_vision_artifact(root: Path) -> Path:
    """The tiny Qwen3.5 vision-language fixture (artifacts/fixture_vision.py), built once per
    root: its tower runs, so a media request is served end to end."""
    return build_vision_fixture("qwen3_5_vl", root)


@contextmanager
def vision_server(
    artifact: Path,
    resolver: Any = None,
    limits: FetchLimits | None = None,
    request_log: Path | None = None,
    **options: Any,
) -> Iterator[tuple[str, ServerState]]:
    """(base URL, state) of the real server on `artifact`, listening on 127.0.0.1 in a thread,
    with --vision and `options` (ServeConfig keywords); `resolver` answers media host names
    (never DNS), `limits` replace the fetch limits (small ones keep the size and time tests
    fast). Metrics and the request log (to `request_log`) observe it as in `ninfer serve`."""
    config = serve_config(
        artifact=str(artifact), log_stats_interval_ms=0, vision=True, max_context=4096, **options
    )
    state = ServerState(config=config, model_id="tiny-vision-text")
    start_engine(state, Artifact(artifact), resolver=resolver)
    if limits is not None:
        state.extra["media"].preparer.fetcher.limits = limits
    log = RequestLog.open(str(request_log), artifact) if request_log is not None else None
    observability = Observability.start(state, Artifact(artifact), request_log=log, argv=[])
    app = create_app(state, extra_handlers=metrics_routes(state))
    try:
        with uvicorn_url(app, log_level="error", lifespan="on") as url:
            yield url, state
    finally:
        state.engine.close()
        state.extra["media"].close()
        observability.close()

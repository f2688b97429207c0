"""Wires a server's observability once its engine is up (called by `ninfer serve`).

    ModelService.observer ─▶ Observer ─┬─▶ ServerMetrics   (GET /metrics)
                                       ├─▶ OpLogSink       (stderr completion records)
                                       └─▶ RequestLogSink  (--request-log-jsonl)
    ThroughputReporter thread ─▶ stderr + JSONL `throughput` every --log-stats-interval-ms

`Observability.start` must run after the warm-up (metrics counters start from that snapshot)
and before the socket serves requests; `close()` stops the reporter and closes the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ninfer.api.observability.metrics import ServerMetrics
from ninfer.api.observability.oplog import OpLogSink
from ninfer.api.observability.request_log import RequestLog, RequestLogSink
from ninfer.api.observability.server_start import resolve_context_cost, server_start_fields
from ninfer.api.observability.throughput import ThroughputReporter
from ninfer.api.server.state import ServerState
from ninfer.api.service.observe import Observer, Sink

log = logging.getLogger("ninfer.serve")


def model_labels(state: ServerState, artifact: Any) -> dict[str, str]:
    """The fixed labels of ninfer_model_info."""
    cfg = state.config
    memory = state.extra.get("memory") or {}  # as server_start: the plan's resolved KV dtype
    kv_dtype = (memory.get("kv") or {}).get("dtype") or cfg.engine.compile.kv_dtype or "unknown"
    return {
        "model": state.model_id,
        "architecture": str(getattr(artifact, "architecture", "unknown")),
        "device": cfg.engine.device,
        "dtype": cfg.engine.dtype,
        "kv_dtype": kv_dtype,
        "spec": cfg.spec or "none",
    }


@dataclass
class Observability:
    """The observers of one running server."""

    metrics: ServerMetrics
    observer: Observer
    request_log: RequestLog | None = None
    reporter: ThroughputReporter | None = None

    @classmethod
    def start(
        cls,
        state: ServerState,
        artifact: Any,
        *,
        request_log: RequestLog | None = None,
        argv: list[str] | None = None,
    ) -> Observability:
        """Install metrics (state.extra["metrics"]), the service's observer and the throughput
        reporter; write server_start to `request_log`. `argv` defaults to sys.argv."""
        cfg = state.config
        # resolved once, before serving; the operational record names each part's source
        log.info(resolve_context_cost(state, artifact).summary())
        metrics = ServerMetrics(state, model_labels(state, artifact))
        state.extra["metrics"] = metrics
        sinks: list[Sink] = [metrics, OpLogSink()]
        if request_log is not None:
            request_log.write("server_start", server_start_fields(state, artifact, argv))
            sinks.append(
                RequestLogSink(request_log, default_thinking_budget=cfg.default_thinking_budget)
            )
            log.info("request log: appending to %s", request_log.path)
        observer = Observer(sinks)
        service = state.extra.get("service")
        if service is not None:
            service.observer = observer
        reporter = None
        engine = state.engine
        if engine is not None and cfg.log_stats_interval_ms > 0:
            reporter = ThroughputReporter(
                engine.snapshot, cfg.log_stats_interval_ms / 1000.0, request_log
            )
            reporter.start()
        return cls(metrics, observer, request_log, reporter)

    def ready(self, url: str) -> None:
        """The readiness record (the app finished starting and serves `url`)."""
        log.info("ready: accepting requests on %s", url)

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
        if self.request_log is not None:
            self.request_log.close()

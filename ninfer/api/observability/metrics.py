"""GET /metrics: Prometheus text format 0.0.4 from published engine snapshots plus API-side
request observations (docs/serving.md, "Live metrics").

    engine worker ──publishes──▶ EngineStats snapshot ◀──reads── EngineCollector.collect()
    ModelService ──RequestTrack──▶ ServerMetrics (Sink): requests_total{outcome}, histograms

A scrape copies the latest snapshot (`Engine.snapshot()` returns a published frozen object) and
formats it on the HTTP side: it never waits for the engine thread, never touches the device and
never resets anything. Engine counters are reported relative to the snapshot taken when
`ServerMetrics` is built (after the startup warm-up), so they start at zero for clients. After an
engine failure the last snapshot stays readable and `ninfer_engine_ready` is 0.

Every family docs/serving.md lists is always present. Host-work phases (ninfer.runtime.host_work), host
context bytes, snapshot transfers and the speculative counters (verify rounds, draft tokens
verified and accepted, decode rows of speculating requests without drafts; 0 without --spec)
come from the engine. Families this engine has nothing to count for read optional snapshot
attributes and stay 0: `materializing` (no context is materialized outside binding):

    spec_decode_{rounds,draft_tokens,accepted_tokens,fallback_steps}_total: int
    materializing: int;  context_transfer_bytes: dict[(resource, direction), int]
    host_work_seconds: dict[phase, float]  (the five HOST_WORK_PHASES; device wait is separate)

Media families (fetches, cache lookups, preprocessing, vision tokens) are ninfer.api.observability.media_metrics'.

Labels are bounded (outcome, phase, resource, direction, and the fixed model identity).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from litestar import Response, get
from litestar.handlers import BaseRouteHandler
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.utils import floatToGoString

from ninfer.api.observability.media_metrics import media_families
from ninfer.api.server.state import ServerState
from ninfer.api.service.generation import Finished
from ninfer.api.service.observe import OUTCOMES, SETTLED_OUTCOMES, RequestRecord, Sink
from ninfer.api.wire.errors import ApiError

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # text/plain; version=0.0.4; charset=utf-8
_MEDIA_TYPE = CONTENT_TYPE.split("; charset")[0]  # Litestar appends the charset itself

HOST_WORK_PHASES = (
    "engine_boundary",
    "program_submit",
    "program_post",
    "engine_commit_output",
    "engine_maintenance",
)
TRANSFER_RESOURCES = ("state", "main_kv", "backend_kv")
TRANSFER_DIRECTIONS = ("device_to_host", "host_to_device")

TTFT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
DURATION_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# (metric name without _total, EngineStats attribute, help)
_ENGINE_COUNTERS = (
    (
        "ninfer_prompt_tokens",
        "prompt_tokens_total",
        "Full prompt tokens, counted once on initial binding",
    ),
    (
        "ninfer_prompt_tokens_cached",
        "prompt_tokens_cached_total",
        "Prompt tokens reused from the prefix cache on initial binding",
    ),
    ("ninfer_prefill_tokens", "prefill_tokens_total", "Prompt tokens computed by initial prefill"),
    (
        "ninfer_replayed_tokens",
        "replayed_tokens_total",
        "Tokens recomputed to recover paused requests",
    ),
    ("ninfer_generation_tokens", "generation_tokens_total", "All committed output tokens"),
    (
        "ninfer_decode_tokens",
        "decode_tokens_total",
        "Committed output tokens of decode rounds (excluding each first token)",
    ),
    ("ninfer_spec_decode_rounds", "spec_decode_rounds_total", "Speculative decoding rounds"),
    (
        "ninfer_spec_decode_draft_tokens",
        "spec_decode_draft_tokens_total",
        "Speculative draft tokens proposed",
    ),
    (
        "ninfer_spec_decode_accepted_tokens",
        "spec_decode_accepted_tokens_total",
        "Speculative draft tokens accepted",
    ),
    (
        "ninfer_spec_decode_fallback_steps",
        "spec_decode_fallback_steps_total",
        "Speculative rounds that fell back to plain decode",
    ),
    ("ninfer_preemptions", "preemptions_total", "Requests paused under resource pressure"),
    (
        "ninfer_snapshot_restores",
        "snapshot_restores_total",
        "Paused requests restored from a host snapshot",
    ),
    ("ninfer_replay_restores", "replay_restores_total", "Paused requests restored by replay"),
    (
        "ninfer_device_wait_seconds",
        "device_wait_seconds_total",
        "Engine worker wall time blocked on device work (not kernel time)",
    ),
)
# (metric name, EngineStats attribute, help)
_ENGINE_GAUGES = (
    ("ninfer_requests_running", "running", "Resident requests"),
    ("ninfer_requests_waiting", "waiting", "Requests waiting for initial admission"),
    ("ninfer_requests_paused", "paused", "Requests paused under resource pressure"),
    ("ninfer_requests_prefilling", "prefilling", "Resident requests in prefill"),
    ("ninfer_requests_decode_ready", "decode_ready", "Resident requests ready to decode"),
    ("ninfer_requests_replaying", "replaying", "Resident requests replaying to recover state"),
    ("ninfer_requests_materializing", "materializing", "Requests materializing context"),
    (
        "ninfer_device_kv_used_pages",
        "kv_pages_used",
        "Main KV pages in use (retained prefixes included)",
    ),
    ("ninfer_device_kv_capacity_pages", "kv_pages_capacity", "Main KV pages in the pool"),
    ("ninfer_device_state_used_slots", "state_slots_used", "Device state slots in use"),
    ("ninfer_device_state_capacity_slots", "state_slots_capacity", "Device state slots"),
    (
        "ninfer_host_context_used_bytes",
        "host_context_used_bytes",
        "Host context bytes in use, reservations included",
    ),
    (
        "ninfer_host_context_reserved_bytes",
        "host_context_reserved_bytes",
        "Host context bytes reserved for in-flight transfers",
    ),
    ("ninfer_host_context_capacity_bytes", "host_context_capacity_bytes", "Host context budget"),
    ("ninfer_host_context_peak_bytes", "host_context_peak_bytes", "Peak host context bytes in use"),
)


class Histogram:
    """A fixed-bucket histogram (seconds), safe to observe from any thread."""

    def __init__(self, name: str, doc: str, buckets: Iterable[float]) -> None:
        self.name, self.doc = name, doc
        self.bounds = tuple(sorted(buckets))
        self._counts = [0] * (len(self.bounds) + 1)  # last: +Inf only
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        value = max(0.0, float(value))
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1
            self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def family(self) -> HistogramMetricFamily:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, n in zip((*self.bounds, float("inf")), counts):
            cumulative += n
            buckets.append((floatToGoString(bound), cumulative))
        return HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=total)


@dataclass
class ApiCounters:
    """Request counters observed on the HTTP side (see ninfer.api.service.observe.OUTCOMES)."""

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    response_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


class ServerMetrics(Sink):
    """The /metrics registry of one server: engine snapshot families plus request observations.

    `model_labels`: the fixed identity on ninfer_model_info (model, architecture, device, dtype,
    kv_dtype, spec). Build it after the engine's warm-up: its counters start from that snapshot.
    """

    def __init__(self, state: ServerState, model_labels: dict[str, str] | None = None) -> None:
        self.state = state
        self.model_labels = dict(model_labels or {"model": state.model_id})
        self.baseline = _snapshot(state)
        self.api = ApiCounters()
        self.ttft = Histogram(
            "ninfer_time_to_first_token_seconds",
            "Preparation entry to the first committed output token",
            TTFT_BUCKETS,
        )
        self.duration = Histogram(
            "ninfer_request_duration_seconds",
            "Lifetime of settled generation requests",
            DURATION_BUCKETS,
        )
        self.queue = Histogram(
            "ninfer_request_queue_seconds",
            "Preparation entry to initial admission of settled generation requests",
            QUEUE_BUCKETS,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def render(self) -> bytes:
        """The exposition text (format 0.0.4)."""
        return generate_latest(self.registry)

    # -- Sink ------------------------------------------------------------------------------

    def request_rejected(self, rec: RequestRecord, err: ApiError) -> None:
        self.api.count(rec.outcome or "rejected")

    def first_token(self, rec: RequestRecord) -> None:
        if rec.first_token_s is not None:
            self.ttft.observe(rec.first_token_s - rec.start_s)

    def request_done(
        self, rec: RequestRecord, finished: Finished | None, err: ApiError | None
    ) -> None:
        self._settle(rec)

    def request_error(self, rec: RequestRecord, kind: str, detail: str) -> None:
        self._settle(rec)

    def response_failed(self, rec: RequestRecord, kind: str) -> None:
        with self.api.lock:
            self.api.response_failures += 1

    def _settle(self, rec: RequestRecord) -> None:
        outcome = rec.outcome or "error"
        self.api.count(outcome)
        if outcome in SETTLED_OUTCOMES:  # exceptional failures are counted, not timed
            self.duration.observe(rec.total_s)
            self.queue.observe(rec.queue_s)

    # -- collection ------------------------------------------------------------------------

    def families(self) -> Iterator[Metric]:
        state, snap, base = self.state, _snapshot(self.state), self.baseline
        info = GaugeMetricFamily(
            "ninfer_model_info", "Model and backend identity", labels=sorted(self.model_labels)
        )
        info.add_metric([self.model_labels[k] for k in sorted(self.model_labels)], 1)
        yield info
        cfg = state.config
        yield GaugeMetricFamily(
            "ninfer_max_concurrency", "Resident execution lanes", value=cfg.engine.max_concurrency
        )
        yield GaugeMetricFamily(
            "ninfer_max_context_tokens",
            "Logical context ceiling of each sequence",
            value=cfg.engine.max_context,
        )
        ready = snap is not None and bool(snap.ready) and state.failure is None
        yield GaugeMetricFamily(
            "ninfer_engine_ready", "1 while the engine can accept work", value=int(ready)
        )
        for name, attr, doc in _ENGINE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=_num(snap, attr))
        for name, attr, doc in _ENGINE_COUNTERS:
            yield CounterMetricFamily(
                name, doc, value=max(0.0, _num(snap, attr) - _num(base, attr))
            )
        transfers = CounterMetricFamily(
            "ninfer_context_transfer_bytes",
            "State / Main KV / backend KV payload bytes transferred",
            labels=["resource", "direction"],
        )
        now, then = _dict(snap, "context_transfer_bytes"), _dict(base, "context_transfer_bytes")
        for resource in TRANSFER_RESOURCES:
            for direction in TRANSFER_DIRECTIONS:
                key = (resource, direction)
                transfers.add_metric(
                    [resource, direction], max(0, now.get(key, 0) - then.get(key, 0))
                )
        yield transfers
        host = CounterMetricFamily(
            "ninfer_host_work_seconds",
            "Engine worker host-active wall time by phase",
            labels=["phase"],
        )
        now, then = _dict(snap, "host_work_seconds"), _dict(base, "host_work_seconds")
        for phase in HOST_WORK_PHASES:
            host.add_metric([phase], max(0.0, now.get(phase, 0.0) - then.get(phase, 0.0)))
        yield host
        requests = CounterMetricFamily(
            "ninfer_requests",
            "Generation requests that entered preparation, by outcome",
            labels=["outcome"],
        )
        with self.api.lock:
            outcomes, failures = dict(self.api.outcomes), self.api.response_failures
        for outcome, n in outcomes.items():
            requests.add_metric([outcome], n)
        yield requests
        yield CounterMetricFamily(
            "ninfer_response_failures",
            "Response rendering, storage or transport failures after a request's outcome",
            value=failures,
        )
        yield self.ttft.family()
        yield self.duration.family()
        yield self.queue.family()
        yield from media_families(state.extra.get("media"))


class _Collector:
    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.families()


def _snapshot(state: ServerState) -> Any:
    snapshot = getattr(state.engine, "snapshot", None)
    return snapshot() if snapshot is not None else None


def _num(snap: Any, attr: str) -> float:
    value = getattr(snap, attr, 0) if snap is not None else 0
    return float(value or 0)


def _dict(snap: Any, attr: str) -> dict[Any, Any]:
    value = getattr(snap, attr, None) if snap is not None else None
    return dict(value) if isinstance(value, dict) else {}


def metrics_of(state: ServerState) -> ServerMetrics:
    """The server's ServerMetrics (`state.extra["metrics"]`), created on first use."""
    metrics = state.extra.get("metrics")
    if metrics is None:
        metrics = state.extra["metrics"] = ServerMetrics(state)
    return metrics


def route_handlers(state: ServerState) -> list[BaseRouteHandler]:
    """GET /metrics (authenticated like every endpoint but /health)."""

    @get("/metrics", sync_to_thread=False)
    def metrics() -> Response[bytes]:
        return Response(metrics_of(state).render(), media_type=_MEDIA_TYPE)

    return [metrics]

"""The fixed-interval throughput report (--log-stats-interval-ms; 0 disables it).

A background thread reads the engine's published snapshot every interval (never the engine
thread or the device), takes counter deltas against the previous one and emits

    stderr: `throughput 5.00 s: prefill 1,234 tok (247 tok/s), decode 456 tok (91.2 tok/s),
             running 2 (prefill 1, decode 1), waiting 1, batch 1.80, device 3.20 s (64%)`
    JSONL:  a `throughput` event with the raw deltas, seconds and end-of-interval gauges

Fully idle intervals (no step ran, no token moved, no context byte transferred, no request
present) are omitted. prefill counts prompt-suffix tokens computed (cache hits excluded); decode
counts tokens committed by decode rounds (each request's first token excluded); batch is decode
row-rounds per round; `host` is the engine worker's host-active time (the five phases of
ninfer.runtime.host_work, device wait excluded) and its fraction of the interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ninfer.api.observability import oplog

log = logging.getLogger("ninfer.throughput")

# interval field -> EngineStats counter
COUNTERS = {
    "prompt_tokens": "prompt_tokens_total",
    "cached_tokens": "prompt_tokens_cached_total",
    "prefill_tokens": "prefill_tokens_total",
    "decode_tokens": "decode_tokens_total",
    "generation_tokens": "generation_tokens_total",
    "replayed_tokens": "replayed_tokens_total",
    "steps": "steps_total",
    "decode_rounds": "decode_rounds_total",
    "decode_rows": "decode_rows_total",
    "preemptions": "preemptions_total",
    "snapshot_restores": "snapshot_restores_total",
    "replay_restores": "replay_restores_total",
    "device_wait_seconds": "device_wait_seconds_total",
    "cache_selections": "cache_selections_total",
    "cache_selection_hits": "cache_selection_hits_total",
    "cache_selected_tokens": "cache_selected_tokens_total",
    "state_captures": "state_captures_total",
    "state_restores": "state_restores_total",
    "cache_evicted_pages": "cache_evicted_pages_total",
}
GAUGES = (
    "running",
    "prefilling",
    "decode_ready",
    "waiting",
    "paused",
    "replaying",
    "materializing",
)
RESOURCES = ("kv_pages_used", "kv_pages_capacity", "state_slots_used", "state_slots_capacity")
HOST_CONTEXT = (
    "host_context_used_bytes",
    "host_context_reserved_bytes",
    "host_context_capacity_bytes",
    "host_context_peak_bytes",
)
STATS_DETAIL = "stats_publication"


@dataclass(frozen=True)
class ThroughputInterval:
    """Counter deltas over `seconds` plus the gauges of the snapshot that ends it."""

    seconds: float
    deltas: dict[str, float]
    gauges: dict[str, int]
    resources: dict[str, int]
    host_work: dict[str, float] | None  # phase -> seconds, when the engine publishes phases
    # (work class, "host" | "device_wait") -> seconds; stats-publication detail seconds / calls
    work_class: dict[tuple[str, str], float] | None = None
    detail_seconds: float = 0.0
    detail_invocations: int = 0
    transfers: dict[tuple[str, str], int] | None = None  # (resource, direction) -> bytes
    host_context: dict[str, int] | None = None  # end-of-interval host context gauges
    last_selection: dict[str, Any] | None = None  # the latest prefix-cache selection (gauge)

    @property
    def idle(self) -> bool:
        return (
            not any(self.deltas.values())
            and not any(self.gauges.values())
            and not any((self.transfers or {}).values())
        )

    def _host_work(self) -> dict[str, Any]:
        """throughput.host_work: the aggregation authority for worker time."""
        d = self.deltas
        rounds, rows = d["decode_rounds"], d["decode_rows"]
        if self.host_work is None:
            return {"elapsed_seconds": None, "device_wait_seconds": d["device_wait_seconds"]}
        elapsed = {**self.host_work, "total": sum(self.host_work.values())}
        classes: dict[str, dict[str, float]] = {}
        for (cls, kind), v in (self.work_class or {}).items():
            classes.setdefault(cls, {})[kind] = v
        decode_host = classes.get("decode", {}).get("host", 0.0)
        n = self.detail_invocations
        return {
            "elapsed_seconds": elapsed,
            "device_wait_seconds": d["device_wait_seconds"],
            "work_class_seconds": classes,
            "detail_subset_seconds": {STATS_DETAIL: self.detail_seconds},
            "detail_invocations": {STATS_DETAIL: n},
            "normalized_seconds": {
                "decode_host_per_round": decode_host / rounds if rounds else None,
                "decode_host_per_row_round": decode_host / rows if rows else None,
                "stats_publication_per_invocation": self.detail_seconds / n if n else None,
            },
        }

    def _context_cache(self) -> dict[str, Any]:
        """throughput.context_cache: interval deltas of prefix selections, state-image
        captures and restores, transfers and pressure evictions; end-of-interval host
        occupancy and the latest selection. ninfer shares only full pages, so no tail page is
        ever copied on write."""
        d, moved = self.deltas, self.transfers or {}
        return {
            "selections": {"count": int(d["cache_selections"]), "hits": int(d["cache_selection_hits"]),
                           "reused_tokens": int(d["cache_selected_tokens"])},
            "captures": int(d["state_captures"]),
            "state_image_operations": {"captures": int(d["state_captures"]),
                                       "restores": int(d["state_restores"])},
            "transfer_bytes": {f"{res}.{way}": int(n) for (res, way), n in sorted(moved.items())},
            "tail_page_cow": 0,
            "pressure_spills": {"evicted_pages": int(d["cache_evicted_pages"])},
            "occupancy": dict(self.host_context or {}),
            "last_selection": self.last_selection,
        }  # fmt: skip

    def fields(self) -> dict[str, Any]:
        """The JSONL `throughput` event body (unrounded)."""
        d = self.deltas
        rounds = d["decode_rounds"]
        return {
            "interval_seconds": self.seconds,
            "tokens": {k: int(d[k]) for k in ("prompt_tokens", "cached_tokens", "prefill_tokens",
                                              "decode_tokens", "generation_tokens", "replayed_tokens")},
            "steps": int(d["steps"]),
            "decode": {
                "rounds": int(rounds),
                "row_rounds": int(d["decode_rows"]),
                "average_size": d["decode_rows"] / rounds if rounds else None,
            },
            "scheduling": {k: int(d[k]) for k in ("preemptions", "snapshot_restores", "replay_restores",
                                                  "replayed_tokens")},
            "scheduler": {**self.gauges, "capture_pending": 0, "terminal_pending": 0},
            "resources": dict(self.resources),
            "host_work": self._host_work(),
            "context_cache": self._context_cache(),
        }  # fmt: skip

    def message(self) -> str:
        """The rounded stderr record (nonzero parts only)."""
        d, g, s = self.deltas, self.gauges, self.seconds
        parts = []
        for name, key in (
            ("prefill", "prefill_tokens"),
            ("decode", "decode_tokens"),
            ("replay", "replayed_tokens"),
        ):
            if d[key]:
                parts.append(
                    f"{name} {oplog.count(d[key])} tok ({oplog.rate(oplog.per_second(d[key], s))} tok/s)"
                )
        parts.append(
            f"running {g['running']} (prefill {g['prefilling']}, decode {g['decode_ready']})"
        )
        for name in ("waiting", "paused", "replaying", "materializing"):
            if g[name]:
                parts.append(f"{name} {g[name]}")
        if d["preemptions"]:
            parts.append(f"preempted {int(d['preemptions'])}")
        if d["decode_rounds"]:
            parts.append(f"batch {d['decode_rows'] / d['decode_rounds']:.2f}")
        busy = sum(self.host_work.values()) if self.host_work else d["device_wait_seconds"]
        label = "host" if self.host_work else "device"
        parts.append(
            f"{label} {oplog.seconds(busy)} ({100.0 * busy / s:.0f}%)" if s > 0 else f"{label} 0 ms"
        )
        return f"throughput {s:.2f} s: " + ", ".join(parts)


def interval(prev: Any, cur: Any, seconds: float) -> ThroughputInterval:
    """The interval from snapshot `prev` to snapshot `cur` (EngineStats-like objects)."""
    deltas = {k: max(0.0, _num(cur, attr) - _num(prev, attr)) for k, attr in COUNTERS.items()}
    gauges = {k: int(_num(cur, k)) for k in GAUGES}
    resources = {k: int(_num(cur, k)) for k in RESOURCES}
    host = _dict_delta(prev, cur, "host_work_seconds")
    return ThroughputInterval(
        seconds,
        deltas,
        gauges,
        resources,
        host or None,  # an engine without phases (an old snapshot) reports device time only
        _dict_delta(prev, cur, "work_class_seconds"),
        max(0.0, _num(cur, "stats_publication_seconds") - _num(prev, "stats_publication_seconds")),
        int(
            _num(cur, "stats_publication_invocations") - _num(prev, "stats_publication_invocations")
        ),
        _dict_delta(prev, cur, "context_transfer_bytes"),
        {k.removeprefix("host_context_"): int(_num(cur, k)) for k in HOST_CONTEXT},
        getattr(cur, "last_cache_selection", None),
    )


def _dict_delta(prev: Any, cur: Any, attr: str) -> dict[Any, Any]:
    """Per-key counter deltas of a dict attribute (missing: empty)."""
    now, then = getattr(cur, attr, None), getattr(prev, attr, None)
    if not isinstance(now, dict):
        return {}
    then = then if isinstance(then, dict) else {}
    return {k: max(0.0, float(v) - float(then.get(k, 0.0))) for k, v in now.items()}


def _num(snap: Any, attr: str) -> float:
    return float(getattr(snap, attr, 0) or 0)


class ThroughputReporter:
    """Every `interval_s`, reports the interval since the last report (unless idle).

    `snapshot`: returns the engine's latest published stats. `request_log`: a RequestLog or None.
    `tick()` does one report and is what the thread calls; tests may call it directly.
    """

    def __init__(
        self,
        snapshot: Callable[[], Any],
        interval_s: float,
        request_log: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.snapshot = snapshot
        self.interval_s = interval_s
        self.request_log = request_log
        self.clock = clock
        self._prev = snapshot()
        self._prev_t = self._end(self._prev, clock())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _end(snap: Any, now: float) -> float:
        """Where the interval that ends with `snap` ends: `now`, or the snapshot's build time
        when the engine was busy then (its counters stand as of then; a segment of worker time
        still running counts in the interval where it ends, so both ends must be publication
        times for its host time to stay within the interval)."""
        p = getattr(snap, "published_s", None)
        if isinstance(p, float) and not getattr(snap, "idle", True) and p <= now:
            return p  # busy: its counters stand as of then
        return now

    def tick(self) -> ThroughputInterval | None:
        """Report the interval ending now; returns it, or None when it was idle (or the busy
        engine has published nothing since the last report: the next one covers it)."""
        cur = self.snapshot()
        end = self._end(cur, self.clock())
        if end <= self._prev_t:
            return None
        iv = interval(self._prev, cur, end - self._prev_t)
        self._prev, self._prev_t = cur, end
        if iv.idle:
            return None
        log.info("%s", iv.message())
        if self.request_log is not None:
            self.request_log.write("throughput", iv.fields())
        return iv

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ninfer-throughput", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # a report must never take the server down
                log.exception("throughput report failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

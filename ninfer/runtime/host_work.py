"""Engine worker wall time, split into mutually exclusive segments (docs/serving.md, "Live
metrics": ninfer_host_work_seconds_total{phase}, ninfer_device_wait_seconds_total; and
docs/request-log.md: throughput.host_work).

The worker calls `start()` when it wakes and `lap(segment)` at the end of every segment: the time
since the previous mark goes to that segment, so each wall-time interval is counted once,
whatever the batch size. Time spent asleep (between `lap` and the next `start`) counts nowhere.

    segment               the worker was ...
    engine_boundary       applying submit / cancel / finish commands at a step boundary
    program_submit        planning the step (expiry, admission, page reservation, chunking)
    program_post          committing the step's sampled tokens (stop conditions, retention)
    engine_commit_output  publishing events to request handles
    engine_maintenance    building the published stats snapshot, aborting on shutdown
    device_wait           blocked in the executor and sampler (host transfers included)

The five host phases are `PHASES`; device wait is kept apart (it is not kernel time: on CPU it is
the whole forward pass). Each step's time is also attributed to one work class: `decode` (a
batch of decode rows only), `prefill` (a batch with a prefill or replay chunk) or `control`
(boundaries and steps that ran no batch). Stats publication is a detail already inside
engine_maintenance. Nothing here imports torch; the clock is `time.perf_counter`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PHASES = (
    "engine_boundary",
    "program_submit",
    "program_post",
    "engine_commit_output",
    "engine_maintenance",
)
DEVICE_WAIT = "device_wait"
WORK_CLASSES = ("decode", "prefill", "control")


class HostWork:
    """Lap timer of the engine worker (single-threaded: only the worker calls it)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._mark = clock()
        self.seconds: dict[str, float] = dict.fromkeys((*PHASES, DEVICE_WAIT), 0.0)
        # (work class, "host" | "device_wait") -> seconds
        self.class_seconds: dict[tuple[str, str], float] = {
            (c, k): 0.0 for c in WORK_CLASSES for k in ("host", DEVICE_WAIT)
        }
        self.stats_seconds = 0.0  # detail: stats publication (inside engine_maintenance)
        self.stats_invocations = 0
        self.work_class = "control"  # the class the next laps are attributed to

    def start(self) -> None:
        """The worker woke up: time before this counts nowhere; boundary work is control."""
        self._mark = self._clock()
        self.work_class = "control"

    def lap(self, segment: str) -> float:
        """Attribute the time since the last mark to `segment`; returns it (seconds)."""
        now = self._clock()
        dt, self._mark = now - self._mark, now
        self.seconds[segment] += dt
        kind = DEVICE_WAIT if segment == DEVICE_WAIT else "host"
        self.class_seconds[(self.work_class, kind)] += dt
        return dt

    def stats(self, dt: float) -> None:
        """`dt` seconds of the last engine_maintenance lap built the stats snapshot."""
        self.stats_seconds += dt
        self.stats_invocations += 1

    def exposure_mark(self) -> tuple[float, ...]:
        """The running totals a request's exposure is measured from (`exposure_since`)."""
        return (
            *(self.seconds[p] for p in PHASES),
            self.seconds[DEVICE_WAIT],
            self.class_seconds[("decode", "host")],
            self.class_seconds[("decode", DEVICE_WAIT)],
        )

    def exposure_since(self, mark: tuple[float, ...]) -> dict[str, object]:
        """Worker time since `mark`: the `Timings.exposure` dict."""
        now = self.exposure_mark()
        d = [b - a for a, b in zip(mark, now)]
        host = dict(zip(PHASES, d[: len(PHASES)]))
        return {
            "host": host,
            "device_wait": d[len(PHASES)],
            "decode_host": d[len(PHASES) + 1],
            "decode_device_wait": d[len(PHASES) + 2],
        }

    def host_seconds(self) -> dict[str, float]:
        """A copy of the five host phases (seconds since the engine started)."""
        return {p: self.seconds[p] for p in PHASES}

"""The bounded host worker pool that runs media preparation off the event loop.

Decoding, resizing and packing an image or a video is CPU work of milliseconds to seconds; run
on the server's event loop it would stall every other request. `PreprocessPool` runs it on at
most `threads` worker threads (``--media-preprocess-threads``; 0 selects min(16, CPU count)).
Pillow, PyAV/FFmpeg, NumPy and torch release the GIL in their heavy loops, so threads scale.
Work beyond the pool's width queues in FIFO order; the caller's deadline still applies while it
waits (cancel the awaiting task and the queued work is dropped when it has not started).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

MAX_DEFAULT_THREADS = 16


def resolve_threads(threads: int) -> int:
    """The worker count for ``--media-preprocess-threads N`` (0: min(16, CPU count))."""
    if threads < 0:
        raise ValueError(f"--media-preprocess-threads must be >= 0, got {threads}")
    if threads == 0:
        return max(1, min(MAX_DEFAULT_THREADS, os.cpu_count() or 1))
    return threads


class PoolStats:
    """Pool counters, thread-safe. tasks: completed tasks; work_seconds: summed worker wall time;
    busy: tasks running now. work_seconds is the process-wide side of the request log's
    media-preprocessing "work" (per request: `preparer.ItemStats.work_seconds`) and would feed
    ninfer_host_work_seconds_total{phase="media_preprocess"} under /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tasks = 0
        self.work_seconds = 0.0
        self.busy = 0

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {"tasks": self.tasks, "work_seconds": self.work_seconds, "busy": self.busy}


class PreprocessPool:
    """A fixed set of worker threads for media preparation. Close it at shutdown."""

    def __init__(self, threads: int = 0):
        self.threads = resolve_threads(threads)
        self.stats = PoolStats()
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="ninfer-media")

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on a worker; the future carries its result or exception."""
        return self._executor.submit(self._timed, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a worker and await it without blocking the event loop.

        Cancelling the awaiting task cancels `fn` if it has not started yet.
        """
        future = self.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop accepting work; queued tasks that have not started are dropped."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _timed(self, fn: Callable[[], T]) -> T:
        stats = self.stats
        with stats._lock:
            stats.busy += 1
        start = time.monotonic()
        try:
            return fn()
        finally:
            elapsed = time.monotonic() - start
            with stats._lock:
                stats.busy -= 1
                stats.tasks += 1
                stats.work_seconds += elapsed

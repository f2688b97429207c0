"""How the benchmark scripts time one call: what a step or a round costs the engine loop."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def timed(
    fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None
) -> float:
    """Median seconds of `fn()` over `repeats` calls after two warm-up calls: the host clock
    around each call and a device sync after it (none on a machine without CUDA). `setup`,
    when given, runs before every call, untimed (the state a call starts from). The sync
    waits for the current stream, taken once: torch.cuda.synchronize() finds the device
    through Python layers that cost more than a small call being timed."""
    sync = torch.cuda.current_stream().synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(2):
        if setup is not None:
            setup()
        fn()
    sync()
    out = []
    for _ in range(repeats):
        if setup is not None:
            setup()
            sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)

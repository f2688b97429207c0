"""The executor of a tensor-parallel engine, for `build_engine` (ninfer/runtime/build.py):
compile every rank's plan on rank 0, start the workers (or reuse a running RankGroup), load
each rank's part of the model on its device, and return rank 0's RankExecutor.

    compile_ranks(artifact, options) ──▶ plans[0..N-1] (same KV pages on every rank)
    RankGroup(N) ── "load", plans ──▶ ranks 1..N-1 build their executors; rank 0 builds its own
                 ◀── every rank's KV pages, or its error (raised here, naming the rank)
    pages differ (CUDA: `auto` sized from each GPU's free memory) ──▶ again at the smallest

Devices: cpu for every rank on cpu; on cuda rank r uses cuda:(device_index + r), and asking
for more ranks than the host has GPUs is a ConfigError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ninfer.errors import ConfigError
from ninfer.ir.plan import Plan
from ninfer.parallel.executor import RankExecutor
from ninfer.parallel.ranks import RankGroup
from ninfer.parallel.worker import make_rank_executor
from ninfer.passes.pipeline import compile_ranks
from ninfer.runtime.config import EngineOptions


def rank_devices(options: EngineOptions) -> list[str]:
    """The device of every rank; ConfigError when the host has too few GPUs."""
    n = options.compile.tensor_parallel
    if options.compile.device == "cpu":
        return ["cpu"] * n
    import torch

    base = options.device_index or 0
    count = torch.cuda.device_count()
    if base + n > count:
        raise ConfigError(
            f"--tensor-parallel {n}: needs CUDA devices cuda:{base}..cuda:{base + n - 1}, this "
            f"host has {count} CUDA device(s)"
        )
    return [f"cuda:{base + r}" for r in range(n)]


def parallel_executor(
    artifact: Any,
    options: EngineOptions,
    ranks: RankGroup | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> tuple[Plan, RankExecutor]:
    """(rank 0's plan, rank 0's executor) of `artifact` sharded over
    `options.compile.tensor_parallel` ranks. `ranks`: a running group of that size to load
    onto (it stays running after the executor closes); None starts one, which the executor
    stops when it closes. `on_fatal(message)` is called from a watchdog thread when a rank dies
    or a collective fails. Raises ConfigError for impossible options."""
    n = options.compile.tensor_parallel
    devices = rank_devices(options)
    plans = compile_ranks(artifact, options.compile)
    first_gpu = options.device_index or 0
    group = (
        ranks if ranks is not None else RankGroup(n, options.compile.device, first_gpu=first_gpu)
    )
    if group.world != n:
        raise ValueError(f"the rank group has {group.world} ranks, the options ask for {n}")
    try:
        if on_fatal is not None:
            group.on_failure(on_fatal)
        local, pages = _load(group, plans, artifact, devices)
        if len(set(pages)) > 1:
            # CUDA sizes `auto` from each GPU's free memory: every rank takes the smallest pool
            fixed = dataclasses.replace(
                options.compile, kv_capacity=min(pages) * plans[0].kv.page_size
            )
            plans = compile_ranks(artifact, fixed)
            local, pages = _load(group, plans, artifact, devices)
    except BaseException:
        if ranks is None:
            group.close()
        raise
    return plans[0], RankExecutor(group, local, owns_group=ranks is None)


def _load(
    group: RankGroup, plans: list[Plan], artifact: Any, devices: list[str]
) -> tuple[Any, list[int]]:
    """Load every rank's plan; (rank 0's executor, every rank's KV pages). ConfigError naming
    the ranks that failed."""
    group.send("load", plans, str(artifact.path), devices)
    local: Any = None
    report: Any
    try:
        local = make_rank_executor(plans[0], artifact, devices[0], group.groups)
        report = local.num_pages
    except Exception as e:  # noqa: BLE001 - every rank reports, then rank 0 raises
        report = f"rank 0: {type(e).__name__}: {e}"
    reports = group.gather(report)
    errors = [r for r in reports if isinstance(r, str)]
    if errors:
        raise ConfigError("tensor parallelism: loading the model failed: " + "; ".join(errors))
    return local, reports

"""`EngineStats`: the engine's gauges and counters, published by its worker after every step
and read by metrics, the throughput report and the request log without touching the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ninfer.runtime.host_work import DEVICE_WAIT

if TYPE_CHECKING:
    from ninfer.runtime.host_work import HostWork
    from ninfer.runtime.scheduler import Scheduler


@dataclass(frozen=True)
class EngineStats:
    """A published snapshot of the engine's gauges (current values) and counters (totals since
    start). Copied out of the worker; reading it never touches the engine."""

    ready: bool
    max_concurrency: int
    max_context: int
    # gauges: requests; prefilling/decode_ready/replaying are subsets of running
    running: int = 0
    waiting: int = 0
    paused: int = 0
    prefilling: int = 0
    decode_ready: int = 0
    replaying: int = 0
    # gauges: resources (retained prefixes occupy these pools too)
    kv_pages_used: int = 0
    kv_pages_capacity: int = 0
    state_slots_used: int = 0
    state_slots_capacity: int = 0
    # gauges: host snapshot budget, bytes (reserved = copies in flight, included in used)
    host_context_used_bytes: int = 0
    host_context_reserved_bytes: int = 0
    host_context_capacity_bytes: int = 0
    host_context_peak_bytes: int = 0
    # counters
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prefill_tokens_total: int = 0
    replayed_tokens_total: int = 0
    generation_tokens_total: int = 0
    decode_tokens_total: int = 0
    preemptions_total: int = 0
    replay_restores_total: int = 0
    snapshot_restores_total: int = 0
    steps_total: int = 0
    decode_rounds_total: int = 0
    decode_rows_total: int = 0
    step_failures_total: int = 0
    # speculative decoding (--spec): verify rounds, draft tokens verified / accepted, decode
    # rows of speculating requests that ran without drafts
    spec_decode_rounds_total: int = 0
    spec_decode_draft_tokens_total: int = 0
    spec_decode_accepted_tokens_total: int = 0
    spec_decode_fallback_steps_total: int = 0
    device_wait_seconds_total: float = 0.0
    requests_by_outcome: dict[str, int] = field(default_factory=dict)
    # worker wall time (host_work.py): the five host phases, and per (work class, "host" |
    # "device_wait"); stats publication is a detail already inside engine_maintenance
    host_work_seconds: dict[str, float] = field(default_factory=dict)
    work_class_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    stats_publication_seconds: float = 0.0
    stats_publication_invocations: int = 0
    # bytes copied by (resource "main_kv" | "state", direction "device_to_host" | "host_to_device")
    context_transfer_bytes: dict[tuple[str, str], int] = field(default_factory=dict)
    # context cache (scheduler counters): prefix selections, state images, pressure evictions
    cache_selections_total: int = 0
    cache_selection_hits_total: int = 0
    cache_selected_tokens_total: int = 0
    state_captures_total: int = 0
    state_restores_total: int = 0
    cache_evicted_pages_total: int = 0
    last_cache_selection: dict[str, object] | None = None
    # when this snapshot was built (engine clock) and whether the worker then had nothing to
    # run (it sleeps until new work arrives): a busy snapshot's counters stand as of published_s
    published_s: float | None = None
    idle: bool = False


def collect_stats(
    sched: Scheduler, work: HostWork, ready: bool, step_failures: int, now: float, idle: bool
) -> EngineStats:
    """The engine's published snapshot, read off its scheduler (gauges, counters) and its
    host-work account at `now` (the engine's clock)."""
    s, c = sched, sched.counters
    running, host = s.running, s.preemption.budget
    return EngineStats(
        ready=ready,
        max_concurrency=sched.config.max_concurrency,
        max_context=sched.config.max_context,
        running=len(running),
        waiting=len(s.waiting) + s.attached,  # with the choices waiting for their prompt
        paused=len(s.paused),
        prefilling=sum(1 for q in running if q.prefilling),
        decode_ready=sum(1 for q in running if q.decode_ready),
        replaying=sum(1 for q in running if q.replaying),
        kv_pages_used=s.pool.num_used,
        kv_pages_capacity=s.pool.num_pages,
        state_slots_used=s.state_slots_used,
        state_slots_capacity=s.num_state_slots,
        host_context_used_bytes=host.used,
        host_context_reserved_bytes=host.reserved,
        host_context_capacity_bytes=host.capacity,
        host_context_peak_bytes=host.peak,
        prompt_tokens_total=c.prompt_tokens,
        prompt_tokens_cached_total=c.cached_tokens,
        prefill_tokens_total=c.prefill_tokens,
        replayed_tokens_total=c.replayed_tokens,
        generation_tokens_total=c.generation_tokens,
        decode_tokens_total=c.decode_tokens,
        preemptions_total=c.preemptions,
        replay_restores_total=c.replay_restores,
        snapshot_restores_total=c.snapshot_restores,
        steps_total=c.steps,
        decode_rounds_total=c.decode_rounds,
        decode_rows_total=c.decode_rows,
        step_failures_total=step_failures,
        **c.spec_totals(),
        device_wait_seconds_total=work.seconds[DEVICE_WAIT],
        requests_by_outcome=dict(c.outcomes),
        context_transfer_bytes=dict(s.preemption.transfer_bytes),
        cache_selections_total=c.cache_selections,
        cache_selection_hits_total=c.cache_selection_hits,
        cache_selected_tokens_total=c.cache_selected_tokens,
        state_captures_total=c.state_captures,
        state_restores_total=c.state_restores,
        cache_evicted_pages_total=s.cache.evicted_pages if s.cache is not None else 0,
        last_cache_selection=c.last_selection,
        published_s=now,
        idle=idle,
        host_work_seconds=work.host_seconds(),
        work_class_seconds=dict(work.class_seconds),
        stats_publication_seconds=work.stats_seconds,
        stats_publication_invocations=work.stats_invocations,
    )

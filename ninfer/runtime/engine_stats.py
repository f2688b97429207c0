"""`EngineStats`: the engine's gauges and counters, published by its worker after every step
and read by metrics, the throughput report and the request log without touching the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


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

"""The media families of GET /metrics (docs/serving.md, "Live metrics"): fetches, the prepared
media cache, preprocessing work and the vision tokens placed in prompts.

Read from the counters the media path keeps (`HttpFetcher.stats`, `MediaCache.snapshot()`,
`PreprocessPool.stats`, `PreparationGate.waits`, `MediaPath.counters`); every family is present
and 0 on a server without --vision. They count from server start (no media work happens during
the warm-up) and never reset. Labels are bounded: fetch outcome and cache lookup result.

    ninfer_media_fetches_total{outcome}        http(s) fetches: ok, failure, timeout
    ninfer_media_fetch_refused_total           URLs refused for a forbidden address (no connect)
    ninfer_media_fetch_bytes_total             body bytes received
    ninfer_media_cache_lookups_total{result}   hit, miss (a new build), join (single flight)
    ninfer_media_cache_evictions_total         retained payloads dropped by LRU
    ninfer_media_budget_rejections_total       builds refused by --media-live-mib
    ninfer_media_cache_retained_bytes          gauge: payloads kept for later requests
    ninfer_media_live_bytes                    gauge: every referenced payload
    ninfer_media_preprocess_tasks_total        decode/resize/pack tasks the workers ran
    ninfer_media_preprocess_seconds_total      worker wall time of those tasks
    ninfer_media_gate_waits_total              requests that waited for a preparation permit
    ninfer_media_prompts_total                 generation prompts that carried media
    ninfer_media_vision_tokens_total           merged vision tokens placed in those prompts
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ninfer.api.service.media_path import MediaPath

FETCH_OUTCOMES = ("ok", "failure", "timeout")
LOOKUP_RESULTS = ("hit", "miss", "join")
COUNTER, GAUGE = "counter", "gauge"


def media_families(media: MediaPath | None) -> Iterator[Metric]:
    """The media families of a server (`media` None: --vision off, all zero)."""
    fetch: dict[str, float] = {}
    cache: dict[str, int] = {}
    pool: dict[str, float] = {}
    gate_waits = prompts = vision_tokens = 0
    if media is not None:
        preparer = media.preparer
        fetch = preparer.fetcher.stats.snapshot()
        cache = preparer.cache.snapshot()
        pool = preparer.pool.stats.snapshot()
        gate_waits = preparer.gate.waits
        with media.counters.lock:
            prompts, vision_tokens = media.counters.prompts, media.counters.vision_tokens
    failures, timeouts = fetch.get("failures", 0), fetch.get("timeouts", 0)
    outcomes = {
        "ok": fetch.get("fetches", 0) - failures - timeouts,
        "failure": failures,
        "timeout": timeouts,
    }
    fetches = CounterMetricFamily(
        "ninfer_media_fetches", "Media fetches over http(s), by outcome", labels=["outcome"]
    )
    for outcome in FETCH_OUTCOMES:
        fetches.add_metric([outcome], outcomes[outcome])
    yield fetches
    yield from _scalars(
        (COUNTER, "ninfer_media_fetch_refused",
         "Media URLs refused for an address the fetch policy forbids, before any connection",
         fetch.get("refused", 0)),
        (COUNTER, "ninfer_media_fetch_bytes", "Media body bytes received", fetch.get("bytes", 0)),
    )  # fmt: skip
    lookups = CounterMetricFamily(
        "ninfer_media_cache_lookups",
        "Prepared-media cache lookups: hit, miss (a new build) or join (single flight)",
        labels=["result"],
    )
    for result, key in zip(LOOKUP_RESULTS, ("hits", "misses", "joins"), strict=True):
        lookups.add_metric([result], cache.get(key, 0))
    yield lookups
    yield from _scalars(
        (COUNTER, "ninfer_media_cache_evictions",
         "Retained prepared payloads dropped by LRU (--media-cache-mib)", cache.get("evictions", 0)),
        (COUNTER, "ninfer_media_budget_rejections",
         "Media builds refused by the live budget (--media-live-mib)", cache.get("rejections", 0)),
        (GAUGE, "ninfer_media_cache_retained_bytes",
         "Prepared payload bytes retained for later requests", cache.get("retained_bytes", 0)),
        (GAUGE, "ninfer_media_live_bytes",
         "Prepared payload bytes referenced by the cache, requests or the runtime",
         cache.get("live_bytes", 0)),
        (COUNTER, "ninfer_media_preprocess_tasks",
         "Media decode/resize/pack tasks run by the preprocessing workers", pool.get("tasks", 0)),
        (COUNTER, "ninfer_media_preprocess_seconds",
         "Worker wall time of media preprocessing (--media-preprocess-threads)",
         pool.get("work_seconds", 0.0)),
        (COUNTER, "ninfer_media_gate_waits", "Requests that waited for a media preparation permit",
         gate_waits),
        (COUNTER, "ninfer_media_prompts", "Generation prompts that carried images or videos",
         prompts),
        (COUNTER, "ninfer_media_vision_tokens", "Merged vision tokens placed in generation prompts",
         vision_tokens),
    )  # fmt: skip


def _scalars(*rows: tuple[str, str, str, float]) -> Iterator[Metric]:
    """One unlabelled family per (kind, name, help, value) row, in order."""
    for kind, name, text, value in rows:
        family = CounterMetricFamily if kind == COUNTER else GaugeMetricFamily
        yield family(name, text, value=value)

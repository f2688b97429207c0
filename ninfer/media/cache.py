"""The prepared-media cache: single-flight builds, LRU retention, a live-bytes account.

Keys are `MediaKey`: the SHA-256 of the acquired bytes, the modality and the preprocessing
settings, so the same bytes sent again (by any request, any protocol) reuse the exact immutable
payload, and a payload prepared under other settings is never confused with it.

Two budgets, in bytes of prepared payload (`PreparedMedia.nbytes`):

- ``cache_bytes`` (``--media-cache-mib``): payloads *retained* for later requests, evicted least
  recently used first. 0 disables retention.
- ``live_bytes`` (``--media-live-mib``): every payload anything references: retained by the
  cache, or held by a request or the runtime through a `MediaRef`. Evicting a held payload only
  drops the cache's claim; its bytes stay live until the last `MediaRef` is released.

`get(key, build)` returns a `MediaRef`. A hit takes a reference; a miss runs `build` once even
when many callers ask for the same key at the same time (the others wait for it: single flight).
When a build completes, its bytes are admitted to the live account, evicting retained payloads
nobody holds; if even that cannot make room, the build is refused with
``media_budget_exceeded``. Builds do not reserve bytes while they run, so concurrent builds can
never deadlock on the account; `PreparationGate` bounds how many requests build at once.

Counters (`CacheStats`) are what the API exports: hits, misses, single-flight joins, evictions,
budget rejections, retained and live bytes (see `CacheStats`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Self

from ninfer.media import errors
from ninfer.media.patches import PreparedMedia


@dataclass(frozen=True)
class MediaKey:
    """What a prepared payload is a function of. digest: SHA-256 hex of the acquired bytes."""

    digest: str
    modality: str
    settings: tuple[Any, ...] = ()

    @classmethod
    def of(cls, data: bytes, modality: str, settings: tuple[Any, ...] = ()) -> MediaKey:
        return cls(hashlib.sha256(data).hexdigest(), modality, settings)


@dataclass
class _Entry:
    key: MediaKey
    media: PreparedMedia
    nbytes: int
    refs: int = 0
    retained: bool = False


@dataclass
class _Flight:
    future: Future[_Entry] = field(default_factory=Future)
    joined: int = 0  # callers waiting on this build; each is owed one reference


class CacheStats:
    """Counters of one `MediaCache` (read under its lock via `MediaCache.snapshot`).

    hits / misses / joins: lookups answered by a payload already prepared, by a new build, or by
    waiting for another caller's build (single flight); prepared: builds completed; evictions:
    retained payloads dropped by LRU; rejections: builds refused by the live budget
    (media_budget_exceeded). With the retained/live byte gauges of `snapshot()` they are what
    an exporter reads. Where they go: the request log's request_start cache hit/miss/single-flight
    fields are per request (`preparer.request_log_fields` counts a request's own lookups, never
    deltas of these process-wide counters); docs/serving.md lists no media series under /metrics
    yet, so exporting these (e.g. as ninfer_media_cache_{hits,misses,joins}_total) needs a row
    there first.
    """

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.joins = 0
        self.prepared = 0
        self.evictions = 0
        self.rejections = 0


class MediaRef:
    """One reference to a prepared payload. Release it (or use it as a context manager) when the
    request or the runtime no longer reads it; releasing twice is harmless."""

    def __init__(self, cache: MediaCache, entry: _Entry, outcome: str):
        self._cache = cache
        self._entry: _Entry | None = entry
        self.key = entry.key
        self.media = entry.media
        self.outcome = outcome  # "hit", "miss" or "join": how this reference was obtained

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._cache._release(entry)

    @property
    def released(self) -> bool:
        return self._entry is None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class MediaCache:
    """See the module docstring. Thread-safe; `build` runs in the calling thread."""

    def __init__(self, cache_bytes: int, live_bytes: int):
        if cache_bytes < 0 or live_bytes <= 0:
            raise ValueError(
                f"media cache budgets must be >= 0 / > 0, got {cache_bytes}, {live_bytes}"
            )
        self.cache_bytes = cache_bytes
        self.live_bytes = live_bytes
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._retained: OrderedDict[MediaKey, _Entry] = OrderedDict()  # LRU order, oldest first
        self._live: dict[MediaKey, _Entry] = {}  # every referenced or retained entry
        self._flights: dict[MediaKey, _Flight] = {}
        self._retained_bytes = 0
        self._live_bytes = 0

    # -- lookups -------------------------------------------------------------------------------

    def get(self, key: MediaKey, build: Callable[[], PreparedMedia]) -> MediaRef:
        """A reference to the payload of `key`, building it with `build` on a miss (once, however
        many callers ask concurrently). Raises what `build` raises, or media_budget_exceeded."""
        found = self.begin(key)
        if isinstance(found, MediaRef):
            return found
        flight, owner = found
        if not owner:
            return self.wait(key, flight)
        try:
            media = build()
        except BaseException as e:
            self.fail(key, flight, e)
            raise
        return self.complete(key, flight, media)

    def begin(self, key: MediaKey) -> MediaRef | tuple[_Flight, bool]:
        """A hit's reference, or (the flight to wait for or to run, whether the caller owns it).
        An owner must end the flight with `complete` or `fail`."""
        with self._lock:
            entry = self._live.get(key)
            if entry is not None:
                self.stats.hits += 1
                entry.refs += 1
                if entry.retained:
                    self._retained.move_to_end(key)
                return MediaRef(self, entry, "hit")
            flight = self._flights.get(key)
            if flight is not None:
                self.stats.joins += 1
                flight.joined += 1
                return flight, False
            self.stats.misses += 1
            flight = self._flights[key] = _Flight()
            return flight, True

    def wait(self, key: MediaKey, flight: _Flight) -> MediaRef:
        """Block until another caller's build of `key` ends; its reference or its error."""
        return MediaRef(self, flight.future.result(), "join")

    def complete(self, key: MediaKey, flight: _Flight, media: PreparedMedia) -> MediaRef:
        """Admit the built payload, retain it, and hand out the owner's and joiners' references."""
        nbytes = media.nbytes
        with self._lock:
            del self._flights[key]
            try:
                self._admit(nbytes)
            except errors.MediaError as e:
                self.stats.rejections += 1
                refused: errors.MediaError | None = e
            else:
                refused = None
                entry = _Entry(key, media, nbytes, refs=1 + flight.joined)
                self._live[key] = entry
                self._live_bytes += nbytes
                self.stats.prepared += 1
                self._retain(entry)
        # Joiners' callbacks run inside set_result / set_exception and may release references,
        # which takes the lock: resolve the flight only after letting go of it.
        if refused is not None:
            flight.future.set_exception(refused)
            raise refused
        flight.future.set_result(entry)
        return MediaRef(self, entry, "miss")

    def fail(self, key: MediaKey, flight: _Flight, error: BaseException) -> None:
        """End a flight whose build raised; its joiners get the same error."""
        with self._lock:
            del self._flights[key]
        flight.future.set_exception(error)

    # -- accounting ----------------------------------------------------------------------------

    def _admit(self, nbytes: int) -> None:
        """Make room for `nbytes` more live bytes, evicting unheld retained payloads (LRU)."""
        if nbytes > self.live_bytes:
            raise errors.budget_exceeded(
                f"one prepared media item needs {_mib(nbytes)}, more than the live media budget "
                f"of {_mib(self.live_bytes)} (--media-live-mib)"
            )
        for key in list(self._retained):
            if self._live_bytes + nbytes <= self.live_bytes:
                return
            if self._retained[key].refs == 0:
                self._evict(key)
        if self._live_bytes + nbytes > self.live_bytes:
            raise errors.budget_exceeded(
                f"prepared media in use is {_mib(self._live_bytes)}; this item's "
                f"{_mib(nbytes)} would pass the live media budget of {_mib(self.live_bytes)} "
                "(--media-live-mib); retry when other requests finish, or send smaller media"
            )

    def _retain(self, entry: _Entry) -> None:
        if entry.nbytes > self.cache_bytes:
            return
        entry.retained = True
        self._retained[entry.key] = entry
        self._retained_bytes += entry.nbytes
        while self._retained_bytes > self.cache_bytes:
            self._evict(next(iter(self._retained)))

    def _evict(self, key: MediaKey) -> None:
        entry = self._retained.pop(key)
        entry.retained = False
        self._retained_bytes -= entry.nbytes
        self.stats.evictions += 1
        if entry.refs == 0:
            self._drop(entry)

    def _drop(self, entry: _Entry) -> None:
        del self._live[entry.key]
        self._live_bytes -= entry.nbytes

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.refs -= 1
            assert entry.refs >= 0, "a media reference was released more often than taken"
            if entry.refs == 0 and not entry.retained:
                self._drop(entry)

    # -- observation ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, int]:
        """Counters and gauges: hits, misses, joins, prepared, evictions, rejections,
        retained_bytes, live_bytes, retained_items, live_items, building."""
        with self._lock:
            s = self.stats
            return {
                "hits": s.hits,
                "misses": s.misses,
                "joins": s.joins,
                "prepared": s.prepared,
                "evictions": s.evictions,
                "rejections": s.rejections,
                "retained_bytes": self._retained_bytes,
                "live_bytes": self._live_bytes,
                "retained_items": len(self._retained),
                "live_items": len(self._live),
                "building": len(self._flights),
            }

    def retained_keys(self) -> list[MediaKey]:
        """Retained keys, least recently used first."""
        with self._lock:
            return list(self._retained)


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"

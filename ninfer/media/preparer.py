"""A request's media, from source strings to held prepared payloads, off the event loop.

`MediaPreparer.prepare_all(items)` is what a request calls once it has parsed its media parts:

1. It enters the `PreparationGate`: at most ``permits`` requests prepare media at once, where
   permits = live budget // the largest payload one request may need (the Vision envelope), so
   every request that is building can finish without the live account deadlocking.
2. Each item's bytes are acquired (`source.acquire`: data URI or a vetted http(s) fetch), hashed,
   and looked up in the `MediaCache`; a miss is prepared on the `PreprocessPool` (decode, resize,
   pack), once however many requests want the same bytes at the same time.
3. It returns one `PreparedItem` per item, in order: a `MediaRef` the request holds until the
   runtime no longer reads the payload, and the item's observations for the request log.

On any failure the references already taken are released and the first `MediaError` propagates,
its `item` set to the index of the refused item.
Cancelling the request (its deadline, a disconnect) cancels waiting and fetching; a build already
running finishes and stays in the cache for the next request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Self

from ninfer.media import errors
from ninfer.media.addresses import FetchPolicy
from ninfer.media.cache import MediaCache, MediaKey, MediaRef
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.fetch import FetchLimits, HttpFetcher
from ninfer.media.image import prepare_image
from ninfer.media.patches import PreparedMedia
from ninfer.media.pool import PreprocessPool
from ninfer.media.source import Modality, acquire
from ninfer.media.video import prepare_video

Build = Callable[[], PreparedMedia]

# The Vision envelope: 32,768 merged tokens = 131,072 raw patches per prompt.
MAX_PROMPT_PATCHES = 131_072


def max_request_payload_bytes(config: VisionPreprocessConfig) -> int:
    """The largest prepared payload one request may hold: the whole envelope of patch rows."""
    row = 3 * config.temporal_patch_size * config.patch_size**2
    element = 2 if config.dtype == "bfloat16" else 4
    return MAX_PROMPT_PATCHES * row * element


class PreparationGate:
    """At most `permits` requests prepare media at the same time (FIFO); counts waits."""

    def __init__(self, permits: int):
        if permits < 1:
            raise ValueError("the media preparation gate needs at least one permit")
        self.permits = permits
        self.waits = 0
        self._semaphore = asyncio.Semaphore(permits)

    async def __aenter__(self) -> Self:
        if self._semaphore.locked():
            self.waits += 1
        await self._semaphore.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._semaphore.release()


@dataclass(frozen=True)
class ItemStats:
    """One item's observations for the request log. outcome: "hit", "miss" or "join" (single
    flight); source: "data" or "http"; acquire_seconds: fetch/decode of the source string;
    prepare_seconds: wall time from the cache lookup to a usable payload; work_seconds: worker
    time this item's own build took (0 for a hit or a join)."""

    modality: Modality
    source: str
    source_bytes: int
    payload_bytes: int
    outcome: str
    acquire_seconds: float
    prepare_seconds: float
    work_seconds: float


def request_log_fields(items: Sequence[ItemStats]) -> dict[str, float | int]:
    """A request's media fields for its request_start record, summed over its items.

    See docs/serving.md, "Request log and stderr records": request_start carries request-scoped
    acquisition, media-preprocessing wall/work, cache hit/miss/single-flight and payload sizes.

    media_items, media_images, media_videos; media_acquire_seconds (fetching / decoding the
    sources); media_prepare_wall_seconds and media_prepare_work_seconds (preparation wall time
    and the worker time of this request's own builds); media_cache_hits, media_cache_misses,
    media_single_flight_joins; media_source_bytes, media_payload_bytes.
    """
    return {
        "media_items": len(items),
        "media_images": sum(1 for i in items if i.modality == "image"),
        "media_videos": sum(1 for i in items if i.modality == "video"),
        "media_acquire_seconds": sum(i.acquire_seconds for i in items),
        "media_prepare_wall_seconds": sum(i.prepare_seconds for i in items),
        "media_prepare_work_seconds": sum(i.work_seconds for i in items),
        "media_cache_hits": sum(1 for i in items if i.outcome == "hit"),
        "media_cache_misses": sum(1 for i in items if i.outcome == "miss"),
        "media_single_flight_joins": sum(1 for i in items if i.outcome == "join"),
        "media_source_bytes": sum(i.source_bytes for i in items),
        "media_payload_bytes": sum(i.payload_bytes for i in items),
    }


@dataclass(frozen=True)
class PreparedItem:
    ref: MediaRef
    stats: ItemStats

    @property
    def media(self) -> PreparedMedia:
        return self.ref.media


class MediaPreparer:
    """The media path of one server (see the module docstring); share it between requests."""

    def __init__(
        self,
        config: VisionPreprocessConfig,
        fetcher: HttpFetcher,
        cache: MediaCache,
        pool: PreprocessPool,
        gate_permits: int | None = None,
    ):
        self.config = config
        self.fetcher = fetcher
        self.cache = cache
        self.pool = pool
        permits = gate_permits or max(1, cache.live_bytes // max_request_payload_bytes(config))
        self.gate = PreparationGate(permits)

    @classmethod
    def create(
        cls,
        config: VisionPreprocessConfig,
        *,
        cache_mib: int,
        live_mib: int,
        threads: int,
        policy: FetchPolicy | None = None,
        limits: FetchLimits | None = None,
    ) -> MediaPreparer:
        """From the server options: --media-cache-mib, --media-live-mib,
        --media-preprocess-threads, and the fetch policy / limits."""
        return cls(
            config,
            HttpFetcher(policy, limits),
            MediaCache(cache_mib << 20, live_mib << 20),
            PreprocessPool(threads),
        )

    def close(self) -> None:
        """Stop the worker pool (server shutdown)."""
        self.pool.close()

    async def prepare_all(self, items: Sequence[tuple[str, Modality]]) -> list[PreparedItem]:
        """(source, modality) pairs -> their prepared items, in order (see the module docstring)."""
        async with self.gate:
            tasks = [
                asyncio.ensure_future(self._prepare_item(i, s, m)) for i, (s, m) in enumerate(items)
            ]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                for done in await asyncio.gather(*tasks, return_exceptions=True):
                    if isinstance(done, PreparedItem):
                        done.ref.release()
                raise
            return [t.result() for t in tasks]

    async def _prepare_item(self, index: int, source: str, modality: Modality) -> PreparedItem:
        try:
            return await self.prepare(source, modality)
        except errors.MediaError as e:
            e.item = index  # which of the request's items was refused, for the field name
            raise

    async def prepare(self, source: str, modality: Modality) -> PreparedItem:
        """One item, without the gate (`prepare_all` holds it for the request)."""
        acquired = await acquire(source, modality, self.fetcher)
        start = time.monotonic()
        key = MediaKey.of(acquired.data, modality, self.config.key())
        work = [0.0]
        build = _timed(_builder(acquired.data, modality, self.config), work)
        ref = await self._get(key, build)
        media = ref.media
        stats = ItemStats(
            modality,
            acquired.source,
            len(acquired.data),
            media.nbytes,
            ref.outcome,
            acquired.seconds,
            time.monotonic() - start,
            work[0],
        )
        return PreparedItem(ref, stats)

    async def _get(self, key: MediaKey, build: Build) -> MediaRef:
        """`MediaCache.get` with the build on the pool and the wait on the event loop."""
        cache = self.cache
        found = cache.begin(key)
        if isinstance(found, MediaRef):
            return found
        flight, owner = found
        if owner:
            result: Future[MediaRef] = Future()

            def finish(done: Future[PreparedMedia]) -> None:
                # Runs when the build ends, whether or not the owner still waits for it.
                if done.cancelled():  # the pool shut down before the build started
                    error: BaseException | None = RuntimeError("the media pool was shut down")
                else:
                    error = done.exception()
                if error is not None:
                    cache.fail(key, flight, error)
                    result.set_exception(error)
                    return
                try:
                    result.set_result(cache.complete(key, flight, done.result()))
                except errors.MediaError as e:
                    result.set_exception(e)

            self.pool.submit(build).add_done_callback(finish)
            return await _hold(result)
        joined: Future[MediaRef] = Future()

        def joined_done(done: Future[object]) -> None:
            error = done.exception()
            if error is not None:
                joined.set_exception(error)
            else:
                joined.set_result(MediaRef(cache, done.result(), "join"))  # type: ignore[arg-type]

        flight.future.add_done_callback(joined_done)
        return await _hold(joined)


def _timed(build: Build, into: list[float]) -> Build:
    def timed() -> PreparedMedia:
        start = time.monotonic()
        try:
            return build()
        finally:
            into[0] = time.monotonic() - start

    return timed


def _builder(data: bytes, modality: Modality, config: VisionPreprocessConfig) -> Build:
    if modality == "image":
        return lambda: prepare_image(data, config)
    return lambda: prepare_video(data, config)


async def _hold(future: Future[MediaRef]) -> MediaRef:
    """Await `future`; if the awaiting task is cancelled, release the reference it will carry."""
    try:
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:
        future.add_done_callback(_release_result)
        raise


def _release_result(future: Future[MediaRef]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()

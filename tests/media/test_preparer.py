"""A request's media end to end: acquisition, the cache, the worker pool and the gate, with real
images (data URIs and a loopback server) and the real image preparation."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import ipaddress
import os
import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image

from ninfer.media import errors
from ninfer.media.addresses import FetchPolicy
from ninfer.media.cache import MediaCache
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.fetch import HttpFetcher
from ninfer.media.image import prepare_image
from ninfer.media.pool import PreprocessPool, resolve_threads
from ninfer.media.preparer import MediaPreparer, max_request_payload_bytes, request_log_fields
from tests.media.servers import LoopbackServer, send_bytes

CONFIG = VisionPreprocessConfig(image_min_pixels=4096, image_max_pixels=128 * 128)
MIB = 1 << 20


def png(seed: int, width: int = 90, height: int = 70) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def preparer(
    cache_mib: int = 64, live_mib: int = 128, config: VisionPreprocessConfig = CONFIG, **kw: object
) -> MediaPreparer:
    policy = FetchPolicy(allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    return MediaPreparer(
        config, HttpFetcher(policy), MediaCache(cache_mib * MIB, live_mib * MIB),
        PreprocessPool(2), **kw,
    )  # fmt: skip


def test_the_same_image_sent_twice_is_prepared_once(
    loopback: Callable[..., LoopbackServer],
) -> None:
    image = png(1)
    server = loopback()
    server.routes["/cat.png"] = send_bytes(image)
    media = preparer()

    async def two_requests() -> None:
        (first,) = await media.prepare_all([(data_uri(image), "image")])
        # the same bytes by URL in a later request: same digest, no second preparation
        (second,) = await media.prepare_all([(server.url("/cat.png"), "image")])
        assert (first.stats.outcome, second.stats.outcome) == ("miss", "hit")
        assert (first.stats.source, second.stats.source) == ("data", "http")
        assert second.media is first.media
        assert first.stats.source_bytes == len(image)
        assert first.stats.payload_bytes == first.media.nbytes
        assert torch.equal(first.media.pixel_values, prepare_image(image, CONFIG).pixel_values)
        first.ref.release()
        second.ref.release()

        fields = request_log_fields([first.stats, second.stats])
        assert fields["media_items"] == 2 and fields["media_images"] == 2
        assert (fields["media_cache_hits"], fields["media_cache_misses"]) == (1, 1)
        assert fields["media_source_bytes"] == 2 * len(image)
        assert first.stats.work_seconds > 0 and second.stats.work_seconds == 0

    asyncio.run(two_requests())
    snap = media.cache.snapshot()
    assert (snap["prepared"], snap["misses"], snap["hits"]) == (1, 1, 1)
    assert media.pool.stats.snapshot()["tasks"] == 1
    assert [k.digest for k in media.cache.retained_keys()] == [hashlib.sha256(image).hexdigest()]


def test_concurrent_requests_for_one_image_build_it_once() -> None:
    media = preparer()
    uri = data_uri(png(2, 400, 300))

    async def many() -> list:
        return await asyncio.gather(*(media.prepare_all([(uri, "image")]) for _ in range(8)))

    results = asyncio.run(many())
    outcomes = sorted(r[0].stats.outcome for r in results)
    snap = media.cache.snapshot()
    assert snap["prepared"] == 1 and snap["misses"] == 1
    assert snap["hits"] + snap["joins"] == 7 and outcomes.count("miss") == 1
    assert all(r[0].media is results[0][0].media for r in results)


def test_preparation_runs_on_the_pool_not_the_event_loop() -> None:
    pool = PreprocessPool(2)

    async def where() -> str:
        return await pool.run(lambda: threading.current_thread().name)

    assert asyncio.run(where()).startswith("ninfer-media")
    pool.close()
    assert resolve_threads(0) == min(16, os.cpu_count() or 1)
    assert resolve_threads(3) == 3
    with pytest.raises(ValueError, match="--media-preprocess-threads"):
        resolve_threads(-1)


def test_a_failed_item_releases_the_request_s_other_references() -> None:
    media = preparer(cache_mib=0)

    async def request() -> None:
        await media.prepare_all(
            [(data_uri(png(3)), "image"), ("data:image/png;base64,AAAA", "image")]
        )

    with pytest.raises(errors.MediaError) as info:
        asyncio.run(request())
    assert info.value.code == errors.INVALID_MEDIA
    assert media.cache.snapshot()["live_bytes"] == 0


def test_the_gate_bounds_concurrent_preparing_requests() -> None:
    assert preparer(live_mib=2048).gate.permits == 2048 * MIB // max_request_payload_bytes(CONFIG)
    assert preparer(live_mib=1).gate.permits == 1
    created = MediaPreparer.create(CONFIG, cache_mib=1024, live_mib=2048, threads=3)
    assert created.pool.threads == 3 and created.cache.live_bytes == 2048 * MIB
    assert created.gate.permits == 2048 * MIB // max_request_payload_bytes(CONFIG) == 5
    created.close()
    media = preparer(gate_permits=1)

    async def two() -> None:
        await asyncio.gather(
            media.prepare_all([(data_uri(png(4)), "image")]),
            media.prepare_all([(data_uri(png(5)), "image")]),
        )

    asyncio.run(two())
    assert media.gate.waits == 1


def test_the_live_budget_is_enforced_across_requests() -> None:
    config = VisionPreprocessConfig(image_min_pixels=4096, image_max_pixels=256 * 256)
    media = preparer(cache_mib=0, live_mib=1, config=config)
    big = data_uri(png(6, 600, 600))  # 16 x 16 patches of 1536 bf16 values: 768 KiB
    other = data_uri(png(7, 600, 600))

    async def hold_then_more() -> None:
        (held,) = await media.prepare_all([(big, "image")])
        assert held.media.nbytes > MIB // 2
        with pytest.raises(errors.MediaError) as info:
            await media.prepare_all([(other, "image")])
        assert info.value.code == errors.MEDIA_BUDGET_EXCEEDED
        held.ref.release()
        (after,) = await media.prepare_all([(other, "image")])
        after.ref.release()

    asyncio.run(hold_then_more())


def test_a_cancelled_request_leaves_no_reference_behind() -> None:
    config = VisionPreprocessConfig(image_min_pixels=4096, image_max_pixels=1024 * 1024)
    media = preparer(cache_mib=0, config=config)
    uri = data_uri(png(8, 1500, 1200))

    async def cancel_mid_build() -> None:
        task = asyncio.ensure_future(media.prepare_all([(uri, "image"), (uri, "image")]))
        while media.cache.snapshot()["building"] == 0 and not task.done():
            await asyncio.sleep(0.001)
        assert not task.done(), "the build ended before the test could cancel it"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(2000):  # the build runs on; its references are released when it ends
            if media.cache.snapshot()["building"] == 0:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)

    asyncio.run(cancel_mid_build())
    snap = media.cache.snapshot()
    assert snap["prepared"] == 1 and snap["building"] == 0
    assert snap["live_bytes"] == 0 and snap["live_items"] == 0

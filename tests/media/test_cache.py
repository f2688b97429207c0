"""The prepared-media cache: single flight, LRU retention, the live budget, held references."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
import torch

from ninfer.media import errors
from ninfer.media.cache import MediaCache, MediaKey
from ninfer.media.patches import PreparedMedia

UNIT = 1024  # bytes of one synthetic payload unit


def payload(units: int) -> PreparedMedia:
    rows = torch.zeros(units * UNIT // 4, 1, dtype=torch.float32)
    return PreparedMedia("image", rows, (1, 2, 2), 1)


def key(name: str) -> MediaKey:
    return MediaKey.of(name.encode(), "image")


class Builds:
    """Build functions that count how often each key was built."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def __call__(self, name: str, units: int = 1):
        def build() -> PreparedMedia:
            self.count[name] = self.count.get(name, 0) + 1
            return payload(units)

        return build


def test_keys_are_the_sha256_of_the_bytes_modality_and_settings() -> None:
    a = MediaKey.of(b"same bytes", "image", (16, 2))
    assert a == MediaKey.of(b"same bytes", "image", (16, 2))
    assert a.digest == hashlib.sha256(b"same bytes").hexdigest()
    assert a != MediaKey.of(b"same bytes", "video", (16, 2))
    assert a != MediaKey.of(b"same bytes", "image", (14, 2))
    assert a != MediaKey.of(b"other bytes", "image", (16, 2))


def test_a_second_lookup_is_a_hit_on_the_same_payload() -> None:
    cache, builds = MediaCache(10 * UNIT, 10 * UNIT), Builds()
    first = cache.get(key("a"), builds("a"))
    second = cache.get(key("a"), builds("a"))
    assert builds.count == {"a": 1}
    assert (first.outcome, second.outcome) == ("miss", "hit")
    assert second.media is first.media
    snap = cache.snapshot()
    assert (snap["hits"], snap["misses"], snap["prepared"]) == (1, 1, 1)


def test_concurrent_lookups_build_once() -> None:
    cache = MediaCache(10 * UNIT, 10 * UNIT)
    callers = 8
    started = threading.Event()
    built = []

    def slow_build() -> PreparedMedia:
        built.append(1)
        started.set()
        # Hold the build until every other caller is waiting on it.
        deadline = time.monotonic() + 10
        while cache.snapshot()["joins"] < callers - 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        return payload(1)

    refs = [None] * callers

    def worker(i: int) -> None:
        if i:
            started.wait(10)
        refs[i] = cache.get(key("same"), slow_build)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(built) == 1
    assert sorted(r.outcome for r in refs) == ["join"] * (callers - 1) + ["miss"]
    assert all(r.media is refs[0].media for r in refs)
    assert cache.snapshot()["joins"] == callers - 1
    for r in refs:
        r.release()
    assert cache.snapshot()["live_bytes"] == UNIT  # retained once, not once per caller


def test_a_failed_build_fails_its_joiners_and_is_not_cached() -> None:
    cache = MediaCache(10 * UNIT, 10 * UNIT)
    go = threading.Event()

    def bad() -> PreparedMedia:
        go.wait(5)
        raise errors.invalid_media("not an image")

    outcome: list[BaseException] = []

    def joiner() -> None:
        while cache.snapshot()["building"] == 0:
            time.sleep(0.002)
        try:
            cache.get(key("bad"), bad)
        except errors.MediaError as e:
            outcome.append(e)

    t = threading.Thread(target=joiner)
    t.start()
    threading.Timer(0.2, go.set).start()
    with pytest.raises(errors.MediaError):
        cache.get(key("bad"), bad)
    t.join(5)
    assert len(outcome) == 1 and outcome[0].code == errors.INVALID_MEDIA
    assert cache.snapshot()["live_items"] == 0
    builds = Builds()
    cache.get(key("bad"), builds("bad")).release()
    assert builds.count == {"bad": 1}


def test_lru_eviction_order_under_the_cache_budget() -> None:
    cache, builds = MediaCache(3 * UNIT, 100 * UNIT), Builds()
    for name in "abc":
        cache.get(key(name), builds(name)).release()
    cache.get(key("a"), builds("a")).release()  # a becomes the most recently used
    cache.get(key("d"), builds("d")).release()  # evicts b, the least recently used
    assert cache.retained_keys() == [key("c"), key("a"), key("d")]
    snap = cache.snapshot()
    assert snap["evictions"] == 1 and snap["retained_bytes"] == 3 * UNIT
    cache.get(key("b"), builds("b")).release()  # b is built again
    assert builds.count == {"a": 1, "b": 2, "c": 1, "d": 1}
    cache.get(key("big"), builds("big", 4)).release()  # larger than the cache: not retained
    assert key("big") not in cache.retained_keys()
    assert cache.snapshot()["live_bytes"] == 3 * UNIT


def test_zero_cache_budget_retains_nothing() -> None:
    cache, builds = MediaCache(0, 10 * UNIT), Builds()
    ref = cache.get(key("a"), builds("a"))
    assert cache.get(key("a"), builds("a")).outcome == "hit"  # still live: shared while held
    ref.release()
    assert cache.snapshot()["live_bytes"] == UNIT  # the second reference is still held
    cache.get(key("b"), builds("b")).release()
    assert cache.snapshot()["retained_items"] == 0


def test_eviction_does_not_invalidate_a_held_reference() -> None:
    cache, builds = MediaCache(2 * UNIT, 10 * UNIT), Builds()
    held = cache.get(key("a"), builds("a"))
    for name in "bcd":
        cache.get(key(name), builds(name)).release()
    assert key("a") not in cache.retained_keys()
    assert held.media.pixel_values.numel() == UNIT // 4  # still readable
    assert cache.snapshot()["live_bytes"] == 3 * UNIT  # a (held) + c, d (retained)
    assert cache.get(key("a"), builds("a")).outcome == "hit"  # still live: no rebuild
    held.release()
    held.release()  # harmless
    assert builds.count["a"] == 1


def test_the_live_budget_refuses_what_held_payloads_leave_no_room_for() -> None:
    cache, builds = MediaCache(4 * UNIT, 4 * UNIT), Builds()
    a = cache.get(key("a"), builds("a", 2))
    b = cache.get(key("b"), builds("b", 2))
    with pytest.raises(errors.MediaError) as info:
        cache.get(key("c"), builds("c", 1))
    assert info.value.code == errors.MEDIA_BUDGET_EXCEEDED and info.value.status == 400
    assert "--media-live-mib" in info.value.message
    snap = cache.snapshot()
    assert snap["rejections"] == 1 and snap["live_bytes"] == 4 * UNIT and snap["building"] == 0
    a.release()
    # a is retained but no longer held: admitting c evicts it instead of refusing.
    cache.get(key("c"), builds("c", 1)).release()
    assert key("a") not in cache.retained_keys()
    assert cache.snapshot()["live_bytes"] == 3 * UNIT
    b.release()
    with pytest.raises(errors.MediaError) as info:
        cache.get(key("huge"), builds("huge", 5))
    assert info.value.code == errors.MEDIA_BUDGET_EXCEEDED and "one prepared" in info.value.message

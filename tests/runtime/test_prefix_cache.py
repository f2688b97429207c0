"""Prefix cache: exact full-page prefix identity, LRU eviction, hybrid checkpoints."""

from __future__ import annotations

from ninfer.runtime.pages import PagePool
from ninfer.runtime.prefix_cache import PrefixCache

PS = 4


def cache_with(pool: PagePool, tokens: list[int], **kw) -> tuple[PrefixCache, list]:
    """A cache holding `tokens` as full pages, inserted the way a finished request leaves them
    (its page references released)."""
    cache = PrefixCache(pool, PS, needs_checkpoint=kw.pop("hybrid", False), **kw)
    return cache, insert(cache, pool, tokens)


def insert(cache: PrefixCache, pool: PagePool, tokens: list[int], parent=None) -> list:
    nodes = []
    for i in range(len(tokens) // PS):
        (page,) = pool.allocate(1)
        node = cache.insert(parent, tuple(tokens[i * PS : (i + 1) * PS]), page)
        pool.release([page])  # the request lets go; the cache keeps its own reference
        nodes.append(node)
        parent = node
    return nodes


def test_match_reuses_exact_full_pages_only():
    pool = PagePool(8)
    cache, nodes = cache_with(pool, list(range(1, 13)))  # 3 pages
    m = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 99, 10, 11, 12, 13], limit=12)
    assert m.nodes == tuple(nodes[:2]) and m.state_slot is None
    assert m.num_tokens(PS) == 8
    # a change in the first page matches nothing: identity is of the whole prefix
    assert cache.match([0, 2, 3, 4, 5, 6, 7, 8], limit=8).nodes == ()
    # the limit keeps at least one token to compute
    assert len(cache.match(list(range(1, 13)), limit=11).nodes) == 2
    # a partial page never matches
    assert len(cache.match([1, 2, 3, 4, 5, 6, 7], limit=7).nodes) == 1
    cache.check()


def test_insert_of_an_existing_prefix_returns_the_cached_node():
    pool = PagePool(4)
    cache, (node,) = cache_with(pool, [1, 2, 3, 4])
    (other,) = pool.allocate(1)
    assert cache.insert(None, (1, 2, 3, 4), other) is node
    assert pool.refcount(other) == 1  # the cache took no reference on the duplicate
    assert cache.num_nodes == 1


def test_eviction_is_lru_over_leaves_and_spares_pages_in_use():
    pool = PagePool(8)
    cache, a = cache_with(pool, [1, 1, 1, 1, 2, 2, 2, 2])
    b = insert(cache, pool, [3, 3, 3, 3, 4, 4, 4, 4])
    cache.match([1, 1, 1, 1, 2, 2, 2, 2, 0], limit=8)  # a is now more recent than b
    pool.retain(a[0].page)  # a resident request uses a's first page
    assert pool.num_reclaimable == 3
    assert cache.evict_pages(1) == 1
    assert not b[1].attached and b[0].attached  # the LRU leaf went first
    assert cache.evict_pages(10) == 2  # b[0], then a[1]; a[0] is in use
    assert a[0].attached and not a[1].attached and not b[0].attached
    assert pool.num_free == 7
    pool.release([a[0].page])
    assert cache.evict_pages(10) == 1 and pool.num_free == 8
    cache.check()
    pool.check()


def test_hybrid_match_stops_at_the_deepest_checkpoint():
    pool = PagePool(8)
    cache, nodes = cache_with(pool, list(range(1, 13)), hybrid=True, checkpoint_slots=range(2, 4))
    assert cache.match(list(range(1, 14)), limit=12).nodes == ()  # no checkpoint yet
    slot = cache.acquire_slot()
    assert cache.attach_checkpoint(nodes[1], slot)
    m = cache.match(list(range(1, 14)), limit=12)
    assert m.nodes == tuple(nodes[:2]) and m.state_slot == slot
    cache.check()


def test_acquire_slot_drops_the_least_recently_used_checkpoint():
    pool = PagePool(8)
    cache, nodes = cache_with(pool, list(range(1, 13)), hybrid=True, checkpoint_slots=range(2, 4))
    s1, s2 = cache.acquire_slot(), cache.acquire_slot()
    cache.attach_checkpoint(nodes[0], s1)
    cache.attach_checkpoint(nodes[2], s2)
    cache.match(list(range(1, 6)), limit=4)  # touches nodes[0]
    s3 = cache.acquire_slot()
    assert s3 == s2 and nodes[2].state_slot is None and nodes[0].state_slot == s1
    cache.release_slot(s3)
    cache.check()


def test_eviction_frees_the_checkpoint_slot_and_attach_to_an_evicted_node_fails():
    pool = PagePool(4)
    cache, (node,) = cache_with(pool, [1, 2, 3, 4], hybrid=True, checkpoint_slots=(5,))
    cache.attach_checkpoint(node, cache.acquire_slot())
    assert cache.num_free_slots == 0
    assert cache.evict_pages(1) == 1
    assert cache.num_free_slots == 1
    slot = cache.acquire_slot()
    assert not cache.attach_checkpoint(node, slot)  # evicted: the slot comes back
    assert cache.num_free_slots == 1
    cache.check()


def test_a_session_keeps_only_its_latest_endpoint():
    pool = PagePool(8)
    cache, nodes = cache_with(pool, list(range(1, 13)), hybrid=True, checkpoint_slots=range(3))
    cache.attach_checkpoint(nodes[0], cache.acquire_slot(), session_key="chat-1")
    cache.attach_checkpoint(nodes[1], cache.acquire_slot(), session_key="chat-2")
    cache.attach_checkpoint(nodes[2], cache.acquire_slot(), session_key="chat-1")
    assert nodes[0].state_slot is None  # replaced by the chain's newer endpoint
    assert nodes[1].state_slot is not None and nodes[2].state_slot is not None
    assert cache.num_free_slots == 1
    cache.check()

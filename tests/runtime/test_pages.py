"""KV page pool: allocation, reference counts, reclaimable accounting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.runtime.pages import PagePool


def test_allocate_is_all_or_nothing_and_distinct():
    pool = PagePool(5)
    a = pool.allocate(3)
    assert a is not None and len(set(a)) == 3
    assert pool.allocate(3) is None  # only 2 left: nothing taken
    assert pool.num_free == 2 and pool.num_used == 3
    b = pool.allocate(2)
    assert b is not None and not set(a) & set(b)
    assert pool.num_free == 0
    pool.check()


def test_shared_page_is_freed_by_its_last_reference():
    pool = PagePool(2)
    (p,) = pool.allocate(1)
    pool.retain(p)
    assert pool.refcount(p) == 2
    pool.release([p])
    assert pool.num_free == 1 and pool.refcount(p) == 1
    pool.release([p])
    assert pool.num_free == 2 and pool.refcount(p) == 0
    pool.check()


def test_reclaimable_counts_pages_held_only_by_the_cache():
    pool = PagePool(4)
    (p,) = pool.allocate(1)  # a request's page
    pool.retain(p)
    pool.set_cached(p, True)  # the cache takes a reference
    assert pool.num_reclaimable == 0  # the request still uses it
    pool.release([p])  # the request finishes
    assert pool.num_reclaimable == 1
    pool.retain(p)  # a new request reuses the prefix
    assert pool.num_reclaimable == 0
    pool.release([p])
    pool.set_cached(p, False)  # the cache evicts it
    pool.release([p])
    assert pool.num_reclaimable == 0 and pool.num_free == 4
    pool.check()


def test_double_free_and_retain_of_free_page_are_bugs():
    pool = PagePool(2)
    (p,) = pool.allocate(1)
    pool.release([p])
    with pytest.raises(AssertionError):
        pool.release([p])
    with pytest.raises(AssertionError):
        pool.retain(p)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("arc"), st.integers(0, 7)), max_size=60))
def test_random_operations_keep_counts_consistent(ops):
    pool = PagePool(8)
    held: list[int] = []  # one entry per reference we hold
    for op, k in ops:
        if op == "a":
            pages = pool.allocate(k % 3 + 1)
            if pages is not None:
                held += pages
        elif op == "r" and held:
            page = held[k % len(held)]
            pool.retain(page)
            held.append(page)
        elif op == "c" and held:
            page = held.pop(k % len(held))
            pool.release([page])
        pool.check()
        assert pool.num_used == len(set(held))
        for page in set(held):
            assert pool.refcount(page) == held.count(page)

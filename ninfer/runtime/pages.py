"""The shared KV page pool: page ids with reference counts.

A page is `page_size` consecutive token positions of one sequence's KV (layout in step.py).
Holders take one reference per page they use: every resident sequence for each page of its
block table, and the prefix cache for each page it retains. A page returns to the free list
when its last reference is released. Full pages may be shared (a reused prefix); a page that a
sequence is still writing is held by that sequence alone.

    pool (8 pages)     refcount  cached
      page 0 ████        2         yes   <- prefix page shared by a request and the cache
      page 1 ██░░        1         no    <- tail page a request is filling
      page 2 ████        1         yes   <- retained by the cache only: reclaimable
      page 3..7          0               <- free

No torch import: this is bookkeeping; the executor owns the memory.
"""

from __future__ import annotations


class PagePool:
    """Allocation and reference counting of `num_pages` KV pages.

    `num_reclaimable` counts pages whose only reference is the prefix cache's (cached and
    refcount 1): the cache can evict them to make room. Invariant failures (double free,
    retaining a free page) raise AssertionError: they are engine bugs, not user errors.
    """

    def __init__(self, num_pages: int) -> None:
        assert num_pages >= 1, num_pages
        self.num_pages = num_pages
        self._refcount = [0] * num_pages
        self._cached = [False] * num_pages
        # LIFO: a freed page is reused first, so a stale reference shows up quickly in tests.
        self._free = list(range(num_pages - 1, -1, -1))
        self.num_reclaimable = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    def is_cached(self, page: int) -> bool:
        return self._cached[page]

    def allocate(self, n: int) -> list[int] | None:
        """Take `n` free pages (refcount 1 each, held by the caller); all or nothing: None
        when fewer than `n` are free."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            assert self._refcount[p] == 0
            self._refcount[p] = 1
        return pages

    def retain(self, page: int) -> None:
        """Add a reference to a page that is in use."""
        rc = self._refcount[page]
        assert rc >= 1, f"retain of free page {page}"
        if rc == 1 and self._cached[page]:
            self.num_reclaimable -= 1
        self._refcount[page] = rc + 1

    def release(self, pages: list[int] | tuple[int, ...]) -> None:
        """Drop one reference per listed page; pages reaching zero become free."""
        for p in pages:
            rc = self._refcount[p]
            assert rc >= 1, f"release of free page {p}"
            self._refcount[p] = rc - 1
            if rc == 2 and self._cached[p]:
                self.num_reclaimable += 1
            elif rc == 1:
                if self._cached[p]:
                    self._cached[p] = False
                    self.num_reclaimable -= 1
                self._free.append(p)

    def set_cached(self, page: int, cached: bool) -> None:
        """Mark whether the prefix cache holds one of this page's references (the cache calls
        this right after retaining, and right before releasing, its reference)."""
        assert self._refcount[page] >= 1
        if self._cached[page] == cached:
            return
        self._cached[page] = cached
        if self._refcount[page] == 1:
            self.num_reclaimable += 1 if cached else -1

    def check(self) -> None:
        """Verify internal consistency (tests call this after every step)."""
        free = set(self._free)
        assert len(free) == len(self._free), "page freed twice"
        for p in range(self.num_pages):
            assert (p in free) == (self._refcount[p] == 0), p
        assert self.num_reclaimable == sum(
            1 for p in range(self.num_pages) if self._cached[p] and self._refcount[p] == 1
        )

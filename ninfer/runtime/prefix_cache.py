"""Exact token-prefix reuse by full KV pages, with recurrent-state checkpoints for hybrids.

The cache is a tree whose nodes are full pages. A node's key is the page's `page_size` token
ids; its path from the root spells the whole prefix, so a node stands for exactly one token
prefix (prefix identity, not hash similarity)::

    root ─ [The cat sat on] ─ [ the mat. It] ─ [ purred.<eos>]      (page_size 4)
               page 3             page 9         page 1, checkpoint slot 5
                              └ [ a hat. Then]
                                  page 4

Attention KV at positions < p depends only on tokens < p, so any matched full page is
reusable. A hybrid model's recurrent layers also need their state *at* the reuse point:
only a node carrying a checkpoint (a state slot holding the recurrent state after the node's
last token) can be resumed from. Checkpoints live in the extra state slots beyond the lanes.

Multimodal prompts: a page that overlaps an image or video (`Request.media`) is keyed by its
token ids *and*, per overlapping span, (offset of the span relative to the page, digest, grid):
placeholder ids are the same for every image, so without them two prompts with other images
would share KV computed from the wrong pixels. A page after the media follows it in the tree,
so its key needs nothing more (its MRoPE positions follow from the path). `page_key` builds
the key for both matching and insertion.

Ownership: the cache holds one pool reference per node page. A node is evictable when it is a
leaf and the cache's is its page's only reference (no resident sequence uses it). Eviction is
LRU over such leaves, and frees the node's checkpoint slot too. Checkpoints alone can also be
dropped (LRU) when a new checkpoint needs a slot.

No torch import.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.pages import PagePool

PageKey = tuple[Any, ...]


def page_key(
    tokens: Sequence[int], media: Sequence[MediaSpan], index: int, page_size: int
) -> PageKey:
    """The cache key of page `index` of a prompt: its `page_size` token ids, followed by
    (offset - page start, digest, grid_thw) of every media span the page overlaps."""
    start, end = index * page_size, (index + 1) * page_size
    key = tuple(tokens[start:end])
    tags = tuple(
        (s.offset - start, s.digest, s.grid_thw) for s in media if s.offset < end and s.end > start
    )
    return key + tags if tags else key


@dataclass(eq=False)
class CacheNode:
    """One full page of a retained prefix. `depth` pages from the root end at position
    depth * page_size. `attached` turns False when the node is evicted."""

    key: PageKey
    page: int
    parent: CacheNode | None
    depth: int
    last_used: int = 0
    state_slot: int | None = None
    session_key: str | None = None
    marked: bool = False  # the checkpoint is a caller-marked boundary
    attached: bool = True
    children: dict[PageKey, CacheNode] = field(default_factory=dict)


class PrefixMatch(NamedTuple):
    """A reusable prefix: `nodes[i]` holds page i. `state_slot` is the checkpoint to restore
    into the lane (hybrid models), else None. Matching does not take references: the caller
    retains `node.page` for every node it keeps."""

    nodes: tuple[CacheNode, ...]
    state_slot: int | None

    def num_tokens(self, page_size: int) -> int:
        return len(self.nodes) * page_size


class PrefixCache:
    """Retained full pages and checkpoints. See the module docstring for the ownership rules.

    `checkpoint_slots` are the state slot ids the cache may hand out (empty for attention-only
    models); `needs_checkpoint` is True for hybrid models, whose matches end at a checkpoint.
    """

    def __init__(
        self,
        pool: PagePool,
        page_size: int,
        *,
        needs_checkpoint: bool,
        checkpoint_slots: range | tuple[int, ...] = (),
    ) -> None:
        self.pool = pool
        self.page_size = page_size
        self.needs_checkpoint = needs_checkpoint
        self.evicted_pages = 0  # pages given back under pressure, since start
        self._children: dict[PageKey, CacheNode] = {}  # children of the root
        self._nodes: set[CacheNode] = set()
        self._free_slots = sorted(checkpoint_slots, reverse=True)
        self.num_slots = len(self._free_slots)
        self._sessions: dict[str, CacheNode] = {}
        self._clock = 0

    # -- queries ----------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def num_checkpoints(self) -> int:
        return sum(1 for n in self._nodes if n.state_slot is not None)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def match(
        self,
        tokens: list[int] | tuple[int, ...],
        limit: int,
        media: Sequence[MediaSpan] = (),
    ) -> PrefixMatch:
        """The longest reusable prefix of `tokens` (whose images/videos are `media`) covering at
        most `limit` tokens (callers pass len(tokens) - 1 so one token is left to compute logits
        from). Marks it recently used."""
        ps = self.page_size
        nodes: list[CacheNode] = []
        children = self._children
        for i in range(limit // ps):
            node = children.get(page_key(tokens, media, i, ps))
            if node is None:
                break
            nodes.append(node)
            children = node.children
        if self.needs_checkpoint:
            while nodes and nodes[-1].state_slot is None:
                nodes.pop()
        self._touch(nodes)
        slot = nodes[-1].state_slot if nodes and self.needs_checkpoint else None
        return PrefixMatch(tuple(nodes), slot)

    # -- insertion --------------------------------------------------------------------------

    def insert(self, parent: CacheNode | None, key: PageKey, page: int) -> CacheNode:
        """Retain full page `page` whose `page_key` is `key` after prefix `parent` (None = root).
        If that prefix is already cached, returns the existing node (whose page the caller
        should switch to) and takes no reference; else retains `page` for the cache."""
        assert len(key) >= self.page_size
        assert parent is None or parent.attached, "insert under an evicted node"
        children = self._children if parent is None else parent.children
        node = children.get(key)
        if node is None:
            depth = 1 if parent is None else parent.depth + 1
            node = CacheNode(key=key, page=page, parent=parent, depth=depth)
            children[key] = node
            self._nodes.add(node)
            self.pool.retain(page)
            self.pool.set_cached(page, True)
        self._touch([node])
        return node

    # -- checkpoints ------------------------------------------------------------------------

    def acquire_slot(self, *, evict_marked: bool = True) -> int | None:
        """A free checkpoint slot; when none is free, drop the least recently used checkpoint
        for it (only unmarked endpoints unless `evict_marked`). None when none can be had."""
        if not self._free_slots:
            held = [
                n
                for n in self._nodes
                if n.state_slot is not None and (evict_marked or not n.marked)
            ]
            if not held:
                return None
            self._drop_checkpoint(min(held, key=lambda n: n.last_used))
        return self._free_slots.pop()

    def release_slot(self, slot: int) -> None:
        """Return a slot obtained from acquire_slot that was not attached to a node."""
        assert slot not in self._free_slots
        self._free_slots.append(slot)

    def attach_checkpoint(
        self,
        node: CacheNode,
        slot: int,
        session_key: str | None = None,
        *,
        marked: bool = False,
    ) -> bool:
        """Record that `slot` holds the recurrent state after `node`'s last token. The cache
        owns the slot from now on. Returns False (and frees the slot) when the node was evicted
        or already has a checkpoint. `marked`: a boundary the caller asked for, which endpoint
        captures never displace. With `session_key`, this becomes that session's retained
        endpoint and the session's previous endpoint checkpoint is dropped."""
        if not node.attached or node.state_slot is not None:
            self.release_slot(slot)
            attached = False
        else:
            node.state_slot = slot
            node.marked = marked
            attached = True
        if session_key is not None:
            previous = self._sessions.get(session_key)
            if previous is not None and previous is not node and previous.state_slot is not None:
                self._drop_checkpoint(previous)
            if node.state_slot is not None:
                self._sessions[session_key] = node
                node.session_key = session_key
        self._touch([node])
        return attached

    def invalidate_slot(self, slot: int) -> None:
        """Forget the checkpoint held in `slot`, if any (its capture did not happen)."""
        for node in self._nodes:
            if node.state_slot == slot:
                self._drop_checkpoint(node)
                return

    def _drop_checkpoint(self, node: CacheNode) -> None:
        assert node.state_slot is not None
        self._free_slots.append(node.state_slot)
        node.state_slot = None
        node.marked = False
        if node.session_key is not None and self._sessions.get(node.session_key) is node:
            del self._sessions[node.session_key]
        node.session_key = None

    # -- eviction ---------------------------------------------------------------------------

    def evict_pages(self, n: int) -> int:
        """Free up to `n` pages by evicting least recently used reclaimable leaves (and then
        their parents as they become leaves). Returns how many pages were freed."""
        heap = [(x.last_used, id(x), x) for x in self._nodes if self._evictable(x)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            self._remove(node)
            freed += 1
            self.evicted_pages += 1
            if parent is not None and self._evictable(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return freed

    def _evictable(self, node: CacheNode) -> bool:
        return not node.children and self.pool.refcount(node.page) == 1

    def _remove(self, node: CacheNode) -> None:
        if node.state_slot is not None:
            self._drop_checkpoint(node)
        siblings = self._children if node.parent is None else node.parent.children
        del siblings[node.key]
        self._nodes.discard(node)
        node.attached = False
        self.pool.set_cached(node.page, False)
        self.pool.release([node.page])

    def _touch(self, nodes: list[CacheNode]) -> None:
        self._clock += 1
        for node in nodes:
            node.last_used = self._clock

    def check(self) -> None:
        """Verify invariants (tests): every node's page is cached and referenced, slots are
        either free or held by exactly one node."""
        held = [n.state_slot for n in self._nodes if n.state_slot is not None]
        assert len(set(held)) == len(held)
        assert not set(held) & set(self._free_slots)
        for n in self._nodes:
            assert n.attached and self.pool.is_cached(n.page) and self.pool.refcount(n.page) >= 1

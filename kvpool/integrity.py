"""The pool's invariants, checked in one place (tests call ``KVPool.check_integrity()``).

Kept apart from :mod:`kvpool.pool` so the hot-path module stays small; it reads the pool's
structures and never changes them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvpool.layout import Geometry
from kvpool.pages import PageState, PageTable
from kvpool.snapshot import PoolSnapshot, ResizeStatus

_OFF, _FREE, _USED, _CACHED = 0, 1, 2, 3


@dataclass(frozen=True)
class PoolParts:
    """What the check reads of a standalone pool, taken under its lock (it changes none of it)."""

    geometry: Geometry
    table: PageTable
    state: bytearray
    free: dict[int, list[int]]
    lru: OrderedDict[int, None]
    n_free: int
    null: bool
    backend_mapped_bytes: int
    snapshot: PoolSnapshot


def check_pool(p: PoolParts) -> None:
    """Raise AssertionError naming the first broken invariant and its numbers."""
    table, state, free, lru = p.table, p.state, p.free, p.lru
    table.check_integrity()
    g = p.geometry
    physical = table.physical_pages * g.page_physical_bytes
    if p.backend_mapped_bytes != physical:
        raise AssertionError(f"backend maps {p.backend_mapped_bytes} bytes, page table says {physical}")
    snap = p.snapshot
    limit = snap.limit_bytes
    if physical > limit and snap.pending.status is not ResizeStatus.DEFERRED:
        raise AssertionError(f"physical {physical} > limit {limit} without a deferred resize")
    for page in range(g.num_pages):
        _check_page(page, table, state, free, g.blocks_of(page))  # type: ignore[arg-type]
    cached = [b for b in lru if state[b] != _CACHED]
    if cached or len(lru) != sum(table.cached):
        raise AssertionError(f"LRU holds {len(lru)} blocks, {sum(table.cached)} cached; non-cached: {cached[:5]}")
    if p.n_free != sum(len(v) for v in free.values()):
        raise AssertionError(f"free counter {p.n_free} != {sum(len(v) for v in free.values())} in free lists")
    mapped_blocks = table.count(PageState.MAPPED) * g.blocks_per_page
    null = 1 if p.null else 0
    total = snap.used_blocks + snap.cached_blocks + snap.free_blocks + null
    if total != mapped_blocks:
        raise AssertionError(f"used+cached+free+null = {total} != {mapped_blocks} blocks in mapped pages")
    if null and state[0] != _USED:
        raise AssertionError("the null block 0 is not held")


def _check_page(page: int, table: PageTable, state: bytearray, free: dict[int, list[int]], blocks: range) -> None:
    codes = [state[b] for b in blocks]
    if table.state[page] is not PageState.MAPPED:
        if any(c != _OFF for c in codes) or page in free:
            raise AssertionError(f"page {page} is {table.state[page].value} but has live blocks or a free list")
        return
    want = (codes.count(_USED), codes.count(_CACHED), codes.count(_FREE))
    have = (table.used[page], table.cached[page], len(free.get(page, ())))
    if want != have or _OFF in codes:
        raise AssertionError(f"page {page}: blocks say used/cached/free {want}, counters say {have}")
    if sorted(free[page]) != [b for b in blocks if state[b] == _FREE]:
        raise AssertionError(f"page {page}: free list {free[page]} disagrees with block states")

"""KVPool: blocks over pages over a VMM backend, with a physical limit that moves at run time.

Threading: one scheduler thread allocates and frees while a control thread resizes, trims and
snapshots; every public method takes the pool's lock, so each is atomic. A method that raises
leaves the pool exactly as it found it (validated before the first change, or rolled back).

Block lifecycle inside a MAPPED page::

    FREE --allocate--> USED --free(cache=False)--> FREE
                         |  --free(cache=True)---> CACHED --reuse--> USED
                         |                           |  --evict (allocation, release)--> FREE

Block 0 is vLLM's null block (padding target); with ``null_block`` it is USED forever and its
page stays mapped.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, PoolExhausted
from kvpool.integrity import PoolParts, check_pool
from kvpool.layout import BlockId, Geometry, PageId
from kvpool.limits import Limit, Verdict
from kvpool.pages import PageState, PageTable
from kvpool.snapshot import PoolSnapshot, ResizeResult, TrimResult
from kvpool.vmm import VMMBackend, open_backend

if TYPE_CHECKING:
    import torch

_OFF, _FREE, _USED, _CACHED = 0, 1, 2, 3  # per-block state codes (bytearray for speed)

ReleaseHook = Callable[[list[BlockId]], None]
"""Called with the cached blocks of pages about to be released, before they are unmapped
(the CPU tier demotes them). It must not call back into the pool."""


class Allocation(NamedTuple):
    blocks: list[BlockId]
    evicted: list[BlockId]  #: cached blocks whose content was dropped to make room


class KVPool:
    """An elastic KV-cache pool for one model on one worker."""

    def __init__(
        self,
        config: PoolConfig,
        backend: VMMBackend | None = None,
        *,
        null_block: bool = True,
        on_release: ReleaseHook | None = None,
    ) -> None:
        self.config = config
        self.geometry = Geometry.fit(config.shape, config.layout, config.page_bytes, config.virtual_bytes)
        g = self.geometry
        self._limit = Limit(config.limit_bytes, g.page_physical_bytes, g.total_bytes, floor_pages=int(null_block))
        self.backend = backend or open_backend(
            config.backend, g.total_bytes, device=config.device, prefault=config.prefault
        )
        if g.segment_bytes % self.backend.granularity or self.backend.size < g.total_bytes:
            raise ConfigError(
                f"page_bytes={config.page_bytes} must be a multiple of the backend granularity "
                f"{self.backend.granularity} and the backend must reserve {g.total_bytes} bytes"
            )
        self._lock = threading.RLock()
        self._table = PageTable(g.num_pages, g.blocks_per_page, self._limit.pages)
        self._state = bytearray(g.num_blocks)
        self._free: dict[int, list[int]] = {}
        self._n_free = 0  # sum of len(self._free[p]): kept so allocation checks capacity in O(1)
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._on_release = on_release
        self._null = null_block
        if null_block:
            page = self._map_new_page()
            self._table.pinned.add(page)
            self._take(page, 1)  # block 0, never handed out

    # ---- blocks ---------------------------------------------------------------------------

    def allocate(self, n: int) -> Allocation:
        """Hand out ``n`` blocks: free ones first, then new pages under the limit, then evict
        least recently cached blocks. Raises :class:`PoolExhausted` (pool unchanged) when the
        limit cannot hold ``n`` more blocks."""
        if n < 0:
            raise ConfigError(f"allocate(n) needs n >= 0, got {n}")
        with self._lock:
            if n > self._n_free and n > self._available_blocks():
                raise PoolExhausted(
                    f"{n} blocks requested, {self._available_blocks()} available under the limit of "
                    f"{self.effective_limit_bytes} bytes; free blocks or raise the limit"
                )
            evicted: list[BlockId] = []
            page = self._table.page_for_allocation()
            if page is not None and len(self._free[page]) >= n:  # fast path: one page serves it
                return Allocation(self._take(page, n), evicted)
            out: list[BlockId] = []
            try:
                while len(out) < n:
                    page = self._table.page_for_allocation()
                    if page is None:  # PageId(0) is falsy: compare with None, never use `or`
                        page = self._grow_one()
                    if page is None:
                        evicted.append(self._evict_lru())
                        continue
                    out.extend(self._take(page, n - len(out)))
            except BaseException:
                self._give_back(out)
                raise
            return Allocation(out, evicted)

    def free(self, blocks: Iterable[BlockId], *, cache: bool = False) -> None:
        """Return used blocks; ``cache=True`` keeps their content for prefix reuse (evictable)."""
        with self._lock:
            ids = self._checked(blocks, _USED, "free")
            bpp, used, touched = self._table.blocks_per_page, self._table.used, set()
            for b in ids:
                page = b // bpp
                used[page] -= 1
                touched.add(page)
                if cache:
                    self._state[b] = _CACHED
                    self._table.cached[page] += 1
                    self._lru[b] = None
                else:
                    self._state[b] = _FREE
                    self._free[page].append(b)
            if not cache:
                self._n_free += len(ids)
            for page in touched:
                self._table.touch(PageId(page))
            if self._table.physical_pages > self._limit.pages:
                self._converge()

    def reuse(self, blocks: Iterable[BlockId]) -> None:
        """Take cached blocks back into use (a prefix-cache hit)."""
        with self._lock:
            for b in self._checked(blocks, _CACHED, "reuse"):
                page = self._table_page(b)
                del self._lru[b]
                self._state[b] = _USED
                self._table.cached[page] -= 1
                self._table.used[page] += 1

    def is_cached(self, block: BlockId) -> bool:
        with self._lock:
            return self._state[block] == _CACHED

    # ---- limit ----------------------------------------------------------------------------

    def resize(self, limit_bytes: int, revision: int) -> ResizeResult:
        """Set the physical limit. Revisions are monotonic: older -> STALE, same revision with
        another limit -> CONFLICT, both without change. Shrinks release idle pages now and the
        rest as their blocks are freed (DEFERRED until then)."""
        with self._lock:
            verdict = self._limit.request(limit_bytes, revision)
            if verdict is Verdict.NEW:
                self._table.limit_pages = self._limit.pages
                self._converge()
                self._limit.accepted()
            return self._limit.result(verdict, self._table.physical_pages)

    def trim(self) -> TrimResult:
        """Release every page that holds no used block now (cached blocks are evicted, demoted
        first through the release hook), the reserve included."""
        with self._lock:
            victims = self._table.release_candidates()
            evicted = sum(self._table.cached[p] for p in victims)
            for page in victims:
                self._release(page)
            return TrimResult(len(victims), len(victims) * self.geometry.page_physical_bytes, evicted)

    def maintain(self) -> int:
        """Refill the reserve up to ``reserve_pages`` within the limit; call it off the hot path
        (after a scheduler step). Returns pages newly backed."""
        with self._lock:
            added = 0
            while (
                self._table.count(PageState.RESERVE) < self.config.reserve_pages
                and self._table.physical_pages < self._limit.pages
                and self._table.unmapped_page() is not None
            ):
                self._map_reserve_page()
                added += 1
            return added

    # ---- reporting ------------------------------------------------------------------------

    @property
    def effective_limit_bytes(self) -> int:
        return self._limit.effective_bytes

    def snapshot(self) -> PoolSnapshot:
        """A consistent, frozen view of the pool (see :class:`PoolSnapshot`)."""
        g, t = self.geometry, self._table
        with self._lock:
            null = 1 if self._null else 0
            mapped_blocks = t.count(PageState.MAPPED) * g.blocks_per_page
            used = sum(t.used) - null
            cached = len(self._lru)
            return self._limit.snapshot(
                g,
                self.config.model,
                t.count(PageState.MAPPED),
                reserve_bytes=t.count(PageState.RESERVE) * g.page_physical_bytes + self.backend.reserve_bytes,
                used_blocks=used,
                cached_blocks=cached,
                free_blocks=mapped_blocks - used - cached - null,
            )

    def check_integrity(self) -> None:
        """Raise AssertionError, with the numbers, if any invariant of the pool is broken."""
        with self._lock:
            check_pool(PoolParts(self.geometry, self._table, self._state, self._free, self._lru, self._n_free,
                                 self._null, self.backend.mapped_bytes, self.snapshot()))  # fmt: skip

    def tensor(self) -> torch.Tensor:
        """The whole virtual buffer as a zero-copy ``uint8`` tensor."""
        return self.backend.as_tensor()

    def close(self) -> None:
        """Release all memory; drop every tensor view of the pool first."""
        with self._lock:
            self.backend.close()

    # ---- internals ------------------------------------------------------------------------

    def _converge(self) -> None:
        """Release idle pages until within the limit; settle a deferred resize when done."""
        excess = self._table.physical_pages - self._limit.pages
        if excess > 0:
            for page in self._table.release_candidates()[:excess]:
                self._release(page)
        self._limit.settle(self._table.physical_pages)

    def _available_blocks(self) -> int:
        t = self._table
        free = self._n_free
        headroom = max(0, self._limit.pages - t.physical_pages) + t.count(PageState.RESERVE)
        growable = min(headroom, t.count(PageState.RESERVE) + t.count(PageState.UNMAPPED))
        return free + len(self._lru) + growable * t.blocks_per_page

    def _grow_one(self) -> PageId | None:
        """Activate a reserve page, else back a new page if the limit allows."""
        page = self._table.reserve_page()
        if page is not None:
            self._activate(page)
            return page
        if self._table.physical_pages >= self._limit.pages or self._table.unmapped_page() is None:
            return None
        return self._map_new_page()

    def _map_reserve_page(self) -> PageId:
        page = self._table.unmapped_page()
        assert page is not None  # callers check first
        self.backend.map_all(self.geometry.page_ranges(page))
        self._table.set_state(page, PageState.RESERVE)
        return page

    def _map_new_page(self) -> PageId:
        page = self._map_reserve_page()
        self._activate(page)
        return page

    def _activate(self, page: PageId) -> None:
        blocks = self.geometry.blocks_of(page)
        self._free[page] = list(reversed(blocks))  # pop() hands out the lowest id first
        self._n_free += len(blocks)
        for b in blocks:
            self._state[b] = _FREE
        self._table.set_state(page, PageState.MAPPED)

    def _release(self, page: PageId) -> None:
        """Evict the page's cached blocks (hook first), then unmap it."""
        blocks = self.geometry.blocks_of(page)
        cached = [BlockId(b) for b in blocks if self._state[b] == _CACHED]
        if cached and self._on_release is not None:
            self._on_release(cached)
        for b in cached:
            del self._lru[b]
        self._table.cached[page] = 0
        for r in self.geometry.page_ranges(page):
            self.backend.unmap(r.offset, r.length)
        for i in blocks:
            self._state[i] = _OFF
        self._n_free -= len(self._free.pop(page, ()))
        self._table.set_state(page, PageState.UNMAPPED)

    def _take(self, page: PageId, n: int) -> list[BlockId]:
        # Hot path (every decode step allocates): slices instead of per-block pops, and the page
        # is re-filed only when its category can have changed (it was empty, or is full now).
        free = self._free[page]
        k = min(n, len(free))
        if k <= 0:  # `del free[-0:]` would empty the list
            return []
        was_empty = self._table.used[page] == 0 and self._table.cached[page] == 0
        taken: list[BlockId] = free[: -k - 1 : -1]  # type: ignore[assignment]
        del free[-k:]
        state = self._state
        for b in taken:
            state[b] = _USED
        self._n_free -= k
        self._table.used[page] += k
        if was_empty or not free:
            self._table.touch(page)
        return taken

    def _give_back(self, blocks: list[BlockId]) -> None:
        for b in blocks:
            page = self._table_page(b)
            self._state[b] = _FREE
            self._free[page].append(b)
            self._n_free += 1
            self._table.used[page] -= 1
            self._table.touch(page)

    def _evict_lru(self) -> BlockId:
        b, _ = self._lru.popitem(last=False)
        page = self._table_page(b)
        self._state[b] = _FREE
        self._table.cached[page] -= 1
        self._free[page].append(b)
        self._n_free += 1
        self._table.touch(page)
        return BlockId(b)

    def _table_page(self, block: int) -> PageId:
        return PageId(block // self.geometry.blocks_per_page)

    def _checked(self, blocks: Iterable[BlockId], want: int, verb: str) -> list[BlockId]:
        ids = list(blocks)
        n = self.geometry.num_blocks
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{verb}: duplicate block ids in {ids}")
        for b in ids:
            if not isinstance(b, int) or not 0 <= b < n:
                raise ConfigError(f"{verb}: block {b!r} is not an id in 0..{n - 1}")
            if self._state[b] != want or (self._null and b == 0):
                raise ConfigError(f"{verb}: block {b} is not {('used', 'cached')[want == _CACHED]}")
        return ids

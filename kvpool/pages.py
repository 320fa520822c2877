"""Page table: which pool pages are backed, how full they are, and which to use or release.

Pure bookkeeping (no torch, no syscalls); :class:`kvpool.pool.KVPool` drives the backend.

    page state    UNMAPPED --map--> RESERVE --activate--> MAPPED
                      ^                |                     |
                      +----release-----+------release--------+   (only when no block is used)

* physical pages = MAPPED + RESERVE; that count never exceeds ``limit_pages`` except while a
  shrink is deferred (blocks still in use above the new limit).
* allocation is best-fit towards compaction: partly filled pages first, then empty mapped pages
  (lowest id first), so high pages drain and can be released whole;
* release victims: RESERVE pages, then mapped pages with no used blocks -- empty ones first,
  then those with the fewest cached blocks, highest id first.
"""

from __future__ import annotations

import enum
import heapq

from kvpool.errors import ConfigError
from kvpool.layout import PageId

_NONE, _PARTIAL, _EMPTY = 0, 1, 2  # allocation categories of a page (heap it is filed in)


class PageState(enum.Enum):
    UNMAPPED = "unmapped"
    RESERVE = "reserve"  #: backed, but its blocks are not handed out yet
    MAPPED = "mapped"  #: backed and its blocks are in use, cached or free


class PageTable:
    """Per-page state and block counters for ``num_pages`` pages of ``blocks_per_page`` blocks."""

    def __init__(self, num_pages: int, blocks_per_page: int, limit_pages: int) -> None:
        if num_pages <= 0 or blocks_per_page <= 0:
            raise ConfigError(f"need pages and blocks, got {num_pages} pages of {blocks_per_page} blocks")
        self.num_pages = num_pages
        self.blocks_per_page = blocks_per_page
        self.limit_pages = limit_pages
        self.state = [PageState.UNMAPPED] * num_pages
        self.used = [0] * num_pages
        self.cached = [0] * num_pages
        self.pinned: set[PageId] = set()
        self._count = {s: 0 for s in PageState}
        self._count[PageState.UNMAPPED] = num_pages
        # Min-heaps of candidate pages, validated lazily on read: a page may sit in a heap after
        # it left the category; it is dropped when it reaches the top.
        self._partial: list[PageId] = []
        self._empty: list[PageId] = []
        self._filed = [_NONE] * num_pages  # the heap holding a valid entry for the page, if any

    def count(self, state: PageState) -> int:
        return self._count[state]

    @property
    def physical_pages(self) -> int:
        return self._count[PageState.MAPPED] + self._count[PageState.RESERVE]

    def free_in(self, page: PageId) -> int:
        return self.blocks_per_page - self.used[page] - self.cached[page]

    def set_state(self, page: PageId, state: PageState) -> None:
        old = self.state[page]
        if old is state:
            return
        if state is not PageState.MAPPED and (self.used[page] or self.cached[page]):
            raise ConfigError(f"page {page} still holds blocks; it cannot become {state.value}")
        self._count[old] -= 1
        self._count[state] += 1
        self.state[page] = state
        self.touch(page)

    def touch(self, page: PageId) -> None:
        """Re-file ``page`` after its counters or state changed (callers must, after every
        change): it is pushed only when its category changes, so a burst of frees costs one push."""
        if self.state[page] is not PageState.MAPPED or not self.free_in(page):
            self._filed[page] = _NONE
            return
        category = _EMPTY if self._is_empty(page) else _PARTIAL
        if self._filed[page] != category:
            heapq.heappush(self._empty if category == _EMPTY else self._partial, page)
            self._filed[page] = category

    def page_for_allocation(self) -> PageId | None:
        """A mapped page with a free block: the lowest partly filled one, else the lowest empty one."""
        for heap, category in ((self._partial, _PARTIAL), (self._empty, _EMPTY)):
            while heap:
                page = heap[0]
                if self._filed[page] == category:  # filed entries are valid (see touch)
                    return page  # the heap holds PageIds already: no NewType call on the hot path
                heapq.heappop(heap)
        return None

    def reserve_page(self) -> PageId | None:
        """Any RESERVE page (lowest id), to activate before mapping a new one."""
        return self._first(PageState.RESERVE, ascending=True)

    def unmapped_page(self) -> PageId | None:
        """The lowest UNMAPPED page, so the mapped set stays dense at the low end."""
        return self._first(PageState.UNMAPPED, ascending=True)

    def release_candidates(self) -> list[PageId]:
        """Pages that could be released now, best victims first (see module docstring)."""
        reserve = [PageId(p) for p, s in enumerate(self.state) if s is PageState.RESERVE and p not in self.pinned]
        idle = [
            PageId(p)
            for p, s in enumerate(self.state)
            if s is PageState.MAPPED and not self.used[p] and p not in self.pinned
        ]
        idle.sort(key=lambda p: (self.cached[p], -p))
        return reserve[::-1] + idle

    def _is_empty(self, page: int) -> bool:
        return not self.used[page] and not self.cached[page]

    def _first(self, state: PageState, *, ascending: bool) -> PageId | None:
        if not self._count[state]:
            return None
        order = range(self.num_pages) if ascending else range(self.num_pages - 1, -1, -1)
        return next(PageId(p) for p in order if self.state[p] is state)

    def check_integrity(self) -> None:
        """Counts agree with per-page states; counters stay inside a page."""
        counted = {s: self.state.count(s) for s in PageState}
        if counted != self._count:
            raise AssertionError(f"page state counts {counted} != tracked {self._count}")
        if sum(counted.values()) != self.num_pages:
            raise AssertionError(f"{sum(counted.values())} pages accounted for, expected {self.num_pages}")
        for p, s in enumerate(self.state):
            if not 0 <= self.used[p] + self.cached[p] <= self.blocks_per_page:
                raise AssertionError(f"page {p}: used {self.used[p]} + cached {self.cached[p]} out of range")
            if s is not PageState.MAPPED and (self.used[p] or self.cached[p]):
                raise AssertionError(f"page {p} is {s.value} but holds blocks")

"""PageTable: state counts stay exact, allocation prefers partly filled pages, and release
candidates come reserve first, then idle pages with the fewest cached blocks."""

from __future__ import annotations

import pytest

from kvpool import ConfigError, PageId
from kvpool.pages import PageState, PageTable


def make_table(pages: int = 6, per_page: int = 4, limit: int = 6) -> PageTable:
    return PageTable(pages, per_page, limit)


def test_partly_filled_pages_are_preferred_over_empty_ones_lowest_first() -> None:
    t = make_table()
    for p in (1, 2, 4):
        t.set_state(PageId(p), PageState.MAPPED)
    assert t.page_for_allocation() == 1
    t.used[4] = 1
    t.touch(PageId(4))
    assert t.page_for_allocation() == 4
    t.used[4] = 4  # full now
    t.touch(PageId(4))
    assert t.page_for_allocation() == 1


def test_release_candidates_come_reserve_first_then_by_fewest_cached() -> None:
    t = make_table()
    for p in range(6):
        t.set_state(PageId(p), PageState.MAPPED)
    t.set_state(PageId(5), PageState.RESERVE)
    t.cached[1], t.cached[2], t.used[3] = 2, 1, 1
    t.pinned.add(PageId(0))
    assert t.release_candidates() == [5, 4, 2, 1]


def test_a_page_with_blocks_cannot_leave_the_mapped_state() -> None:
    t = make_table()
    t.set_state(PageId(0), PageState.MAPPED)
    t.used[0] = 1
    with pytest.raises(ConfigError, match="still holds blocks"):
        t.set_state(PageId(0), PageState.UNMAPPED)
    assert t.count(PageState.MAPPED) == 1
    t.check_integrity()


def test_counts_follow_state_changes() -> None:
    t = make_table()
    t.set_state(PageId(0), PageState.RESERVE)
    t.set_state(PageId(1), PageState.MAPPED)
    t.set_state(PageId(0), PageState.MAPPED)
    assert (t.count(PageState.MAPPED), t.count(PageState.RESERVE), t.count(PageState.UNMAPPED)) == (2, 0, 4)
    assert t.physical_pages == 2
    assert t.unmapped_page() == 2
    t.check_integrity()

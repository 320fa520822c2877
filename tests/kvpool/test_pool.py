"""KVPool on the real host backend: allocation packs pages, the limit moves at run time with
revision semantics, shrinks defer until blocks free, trim returns memory to the OS, and every
refused call leaves the pool unchanged."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kvpool import ConfigError, KVLayout, KVPool, PoolExhausted, ResizeStatus
from tests.kvpool.factories import KiB, MiB, make_config, rss_bytes

# Uniform TINY pool with 64 KiB pages: 2 blocks (32 KiB each) per page; block 0 is the null block.


def test_allocation_fills_the_partly_used_page_before_mapping_a_new_one(make_pool: Any) -> None:
    pool = make_pool()
    assert pool.allocate(0).blocks == []
    assert pool.allocate(1).blocks == [1]  # page 0 already holds the null block
    assert pool.allocate(3).blocks == [2, 3, 4]
    pool.free([3])
    assert pool.allocate(1).blocks == [3]  # back into page 1 rather than the empty tail of page 2
    assert pool.snapshot().mapped_bytes == 3 * 64 * KiB
    pool.check_integrity()


def test_reuses_a_reserve_page_before_mapping_a_new_one(make_pool: Any) -> None:
    pool = make_pool(reserve_pages=1)
    assert pool.maintain() == 1
    snap = pool.snapshot()
    assert (snap.mapped_bytes, snap.reserve_bytes) == (64 * KiB, 64 * KiB)
    mapped_before = pool.backend.mapped_bytes
    assert pool.allocate(3).blocks == [1, 2, 3]  # page 0's free block, then the reserve page
    assert pool.backend.mapped_bytes == mapped_before  # no new mapping was needed
    assert pool.snapshot().reserve_bytes == 0
    pool.check_integrity()


def test_cached_blocks_are_reused_and_evicted_oldest_first(make_pool: Any) -> None:
    pool = make_pool(limit_bytes=3 * 64 * KiB)  # 3 pages = 6 blocks, 5 usable
    blocks = pool.allocate(5).blocks
    pool.free(blocks[:3], cache=True)  # cached in order 1, 2, 3
    pool.reuse([blocks[1]])
    got = pool.allocate(2)
    assert (got.blocks, got.evicted) == ([1, 3], [1, 3])
    pool.check_integrity()


def test_an_exhausted_pool_refuses_and_stays_unchanged(make_pool: Any) -> None:
    pool = make_pool(limit_bytes=2 * 64 * KiB)
    pool.allocate(2)
    before = pool.snapshot()
    with pytest.raises(PoolExhausted, match="raise the limit"):
        pool.allocate(2)
    assert pool.snapshot() == before
    pool.check_integrity()


def test_resize_revisions_stale_and_conflicting_requests_change_nothing(make_pool: Any) -> None:
    pool = make_pool()
    assert pool.resize(8 * MiB, 5).status is ResizeStatus.APPLIED
    assert pool.resize(8 * MiB, 5).status is ResizeStatus.APPLIED  # idempotent retry
    before = pool.snapshot()
    assert pool.resize(4 * MiB, 4).status is ResizeStatus.STALE
    assert pool.resize(4 * MiB, 5).status is ResizeStatus.CONFLICT
    after = pool.snapshot()
    assert (after.limit_bytes, after.pending) == (before.limit_bytes, before.pending)
    assert after.resizes == {"applied": 1, "stale": 1, "conflict": 1}


def test_a_shrink_below_used_memory_defers_and_completes_as_blocks_free(make_pool: Any) -> None:
    pool = make_pool()
    blocks = pool.allocate(9).blocks  # pages 0..4
    result = pool.resize(2 * 64 * KiB, 1)
    assert result.status is ResizeStatus.DEFERRED
    assert result.effective_limit_bytes == 2 * 64 * KiB
    pool.check_integrity()
    pool.free(blocks[:6])
    assert pool.snapshot().pending.status is ResizeStatus.DEFERRED
    pool.free(blocks[6:])
    snap = pool.snapshot()
    assert snap.pending.status is ResizeStatus.APPLIED
    assert snap.mapped_bytes + snap.reserve_bytes <= 2 * 64 * KiB
    pool.check_integrity()


def test_trim_returns_idle_pages_to_the_os(make_pool: Any) -> None:
    pool = make_pool(page_bytes=2 * MiB, limit_bytes=64 * MiB)
    blocks = pool.allocate(640).blocks  # 11 pages of 2 MiB (64 blocks each) with the null block
    for view_block in blocks:
        assert pool.backend.is_mapped(view_block * 32 * KiB)
    rss_full = rss_bytes()
    pool.free(blocks[:600], cache=True)
    result = pool.trim()
    # blocks 1..600 cached: pages 1..8 wholly cached go; page 0 is pinned (null block) and
    # pages 9..10 still hold used blocks 601..640 (and cached 576..600)
    assert (result.released_pages, result.evicted_blocks) == (8, 8 * 64)
    assert rss_full - rss_bytes() >= 14 * MiB
    snap = pool.snapshot()
    assert (snap.used_blocks, snap.cached_blocks, snap.mapped_bytes) == (40, 63 + 25, 3 * 2 * MiB)
    pool.check_integrity()


def test_release_hook_sees_cached_blocks_before_their_page_is_unmapped(make_pool: Any) -> None:
    seen: list[list[int]] = []
    pool = KVPool(make_config(), on_release=lambda blocks: seen.append([int(b) for b in blocks]))
    try:
        blocks = pool.allocate(5).blocks
        pool.free(blocks, cache=True)
        pool.trim()
        assert sorted(b for group in seen for b in group) == [2, 3, 4, 5]  # page 0 (null) stays
        assert pool.is_cached(1)
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("limit", "revision", "message"),
    [
        (-1, 1, "limit_bytes=-1 must be between"),
        (1 << 50, 1, "must be between"),
        (10, 1, "one page"),
        (1 * MiB, -3, "revision must be >= 0"),
        ("big", 1, "limit_bytes must be an integer"),
        (1 * MiB, True, "revision must be an integer"),
    ],
)
def test_bad_resize_arguments_are_refused_and_the_pool_is_unchanged(
    make_pool: Any, limit: Any, revision: Any, message: str
) -> None:
    pool = make_pool()
    before = pool.snapshot()
    with pytest.raises(ConfigError, match=message):
        pool.resize(limit, revision)
    assert pool.snapshot() == before


@pytest.mark.parametrize(
    ("blocks", "message"),
    [([0], "block 0 is not used"), ([1, 1], "duplicate"), ([9999], "not an id"), ([7], "block 7 is not used")],
)
def test_freeing_blocks_that_are_not_in_use_is_refused(make_pool: Any, blocks: list[int], message: str) -> None:
    pool = make_pool()
    pool.allocate(2)
    before = pool.snapshot()
    with pytest.raises(ConfigError, match=message):
        pool.free(blocks)  # type: ignore[arg-type]
    assert pool.snapshot() == before
    pool.check_integrity()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"limit_bytes": 128 * MiB}, "limit_bytes=134217728 must be between 0 and virtual_bytes"),
        ({"page_bytes": 5000}, "page_bytes=5000 must be a positive multiple of 4096"),
        ({"page_bytes": 24 * KiB}, "set page_bytes to a multiple of 32768"),
        ({"virtual_bytes": 64 * KiB, "limit_bytes": 0}, "raise virtual_bytes"),
        ({"reserve_pages": -1}, "reserve_pages must be >= 0"),
    ],
)
def test_bad_configuration_names_the_setting(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KVPool(make_config(**overrides))


def test_per_layer_pages_map_one_range_in_every_layer_region(make_pool: Any) -> None:
    pool = make_pool(layout=KVLayout.PER_LAYER)
    geo = pool.geometry
    pool.allocate(geo.blocks_per_page)  # fills page 0 (with the null block) and opens page 1
    for page in (0, 1):
        for r in geo.page_ranges(page):
            assert pool.backend.is_mapped(r.offset)
            assert pool.backend.is_mapped(r.offset + r.length - 1)
    assert pool.backend.mapped_bytes == 2 * geo.page_physical_bytes
    pool.check_integrity()


def test_a_scheduler_thread_and_a_control_thread_can_work_concurrently(make_pool: Any) -> None:
    pool = make_pool(limit_bytes=32 * MiB)
    errors: list[BaseException] = []
    stop = threading.Event()

    def scheduler() -> None:
        try:
            while not stop.is_set():
                try:
                    got = pool.allocate(7).blocks
                except PoolExhausted:
                    continue
                pool.free(got[:3], cache=True)
                pool.free(got[3:])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=scheduler)
    thread.start()
    for revision in range(1, 200):
        pool.resize((4 + revision % 20) * MiB, revision)
        if revision % 7 == 0:
            pool.trim()
        pool.snapshot()
    stop.set()
    thread.join()
    assert errors == []
    pool.check_integrity()

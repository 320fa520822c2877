"""Randomised alloc / free / reuse / resize / trim sequences (hypothesis state machine):
``check_integrity()`` holds after every step, and once a resize reports ``applied`` the pool's
physical memory never exceeds the limit."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpool import KVLayout, KVPool, PoolExhausted, ResizeStatus
from tests.kvpool.factories import KiB, MiB, make_config

PAGE = 64 * KiB


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool: KVPool | None = None
        self.used: list[int] = []
        self.cached: list[int] = []
        self.revision = 0

    @rule(layout=st.sampled_from(list(KVLayout)), reserve=st.integers(0, 2))
    @precondition(lambda self: self.pool is None)
    def open_pool(self, layout: KVLayout, reserve: int) -> None:
        page = PAGE if layout is KVLayout.UNIFORM else 8 * KiB  # keep per-layer pages small too
        self.pool = KVPool(
            make_config(
                layout=layout, page_bytes=page, virtual_bytes=4 * MiB, limit_bytes=1 * MiB, reserve_pages=reserve
            )
        )

    @rule(n=st.integers(0, 40))
    @precondition(lambda self: self.pool is not None)
    def allocate(self, n: int) -> None:
        assert self.pool is not None
        try:
            got = self.pool.allocate(n)
        except PoolExhausted:
            return
        self.used += got.blocks
        self.cached = [b for b in self.cached if b not in set(got.evicted)]

    @rule(data=st.data(), cache=st.booleans())
    @precondition(lambda self: self.pool is not None and self.used)
    def free(self, data: st.DataObject, cache: bool) -> None:
        assert self.pool is not None
        k = data.draw(st.integers(1, len(self.used)))
        chosen, self.used = self.used[:k], self.used[k:]
        self.pool.free(chosen, cache=cache)  # type: ignore[arg-type]
        if cache:
            self.cached += chosen

    @rule(data=st.data())
    @precondition(lambda self: self.pool is not None and self.cached)
    def reuse(self, data: st.DataObject) -> None:
        assert self.pool is not None
        live = [b for b in self.cached if self.pool.is_cached(b)]  # type: ignore[arg-type]
        if not live:
            self.cached = []
            return
        block = data.draw(st.sampled_from(live))
        self.pool.reuse([block])  # type: ignore[list-item]
        self.cached.remove(block)
        self.used.append(block)

    @rule(pages=st.integers(1, 64))
    @precondition(lambda self: self.pool is not None)
    def resize(self, pages: int) -> None:
        assert self.pool is not None
        self.revision += 1
        limit = min(pages * self.pool.geometry.page_physical_bytes, self.pool.geometry.total_bytes)
        result = self.pool.resize(limit, self.revision)
        assert result.status in (ResizeStatus.APPLIED, ResizeStatus.DEFERRED)

    @rule()
    @precondition(lambda self: self.pool is not None)
    def trim_and_maintain(self) -> None:
        assert self.pool is not None
        self.pool.trim()
        self.pool.maintain()

    @invariant()
    def consistent(self) -> None:
        if self.pool is None:
            return
        self.pool.check_integrity()
        snap = self.pool.snapshot()
        assert snap.used_blocks == len(self.used)
        if snap.pending.status is ResizeStatus.APPLIED:
            assert snap.mapped_bytes + snap.reserve_bytes <= snap.limit_bytes

    def teardown(self) -> None:
        if self.pool is not None:
            self.pool.close()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)

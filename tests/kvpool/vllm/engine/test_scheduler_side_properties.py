"""The engine pool (``SchedulerSide`` over vLLM's real ``BlockPool``) under randomised sequences
of allocations, frees, resizes, trims and engine steps whose page commands every rank
acknowledges -- or one rank fails: ``check_integrity()`` holds after every step, the blocks we
hold are exactly vLLM's used ones, and a resize that reports ``applied`` with no command in
flight keeps physical pages within the limit. The same rules as the standalone pool's machine
(``tests/kvpool/test_pool_properties.py``): both pools share one ``Limit``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvpool import ResizeStatus
from tests.kvpool.vllm.engine.test_scheduler_side import ack, make_side

pytestmark = pytest.mark.slow  # imports vLLM


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.side = make_side(limit_pages=6, pages=16, grow_ahead=6)
        self.held: list[Any] = []
        self.revision = 0

    @rule(n=st.integers(1, 12))
    def allocate(self, n: int) -> None:
        bp = self.side.block_pool
        n = min(n, bp.get_num_free_blocks())
        if n:
            self.held += bp.get_new_blocks(n)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        if not self.held:
            return
        k = data.draw(st.integers(1, len(self.held)))
        start = data.draw(st.integers(0, len(self.held) - k))
        chosen = self.held[start : start + k]
        del self.held[start : start + k]
        self.side.block_pool.free_blocks(chosen)

    @rule(pages=st.integers(1, 16))
    def resize(self, pages: int) -> None:
        self.revision += 1
        result = self.side.resize(pages * self.side.page_bytes, self.revision)
        assert result.status in (ResizeStatus.APPLIED, ResizeStatus.DEFERRED)
        assert result.revision == self.revision

    @rule()
    def stale_resize(self) -> None:
        before = self.side.snapshot()
        assert self.side.resize(self.side.page_bytes, max(0, self.revision - 1)).status in (
            ResizeStatus.STALE, ResizeStatus.CONFLICT, ResizeStatus.APPLIED, ResizeStatus.DEFERRED,
        )  # fmt: skip
        if self.revision > 0:
            assert self.side.snapshot().limit_bytes == before.limit_bytes

    @rule()
    def trim(self) -> None:
        result = self.side.trim()
        assert result.released_bytes == result.released_pages * self.side.page_bytes

    @rule(demand=st.integers(0, 16), fail=st.booleans())
    def step(self, demand: int, fail: bool) -> None:
        cmds = self.side.step(scheduled_tokens=demand, demand_blocks=demand)
        failed = {cmds[0].seq: "one rank refused the map"} if fail and cmds else {}
        ack(self.side, cmds, failed)

    @invariant()
    def consistent(self) -> None:
        side = self.side
        side.check_integrity()
        snap = side.snapshot()
        assert snap.used_blocks == len(self.held)
        settled = snap.pending.status is ResizeStatus.APPLIED and not side.inflight and not side.outbox
        if settled:
            assert snap.physical_bytes <= snap.limit_bytes


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)

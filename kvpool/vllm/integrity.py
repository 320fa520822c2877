"""Invariants of an engine pool (the scheduler half over vLLM's BlockPool)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.pages import PageState
from kvpool.snapshot import ResizeStatus

if TYPE_CHECKING:
    from kvpool.vllm.scheduler_side import SchedulerSide


def check_engine_pool(side: SchedulerSide) -> None:
    """Raise AssertionError naming the first broken invariant, with its numbers.

    * a block in a page that is not MAPPED (or is draining and withheld) is never in vLLM's free
      queue and never referenced; blocks of MAPPED, non-draining pages are never withheld;
    * vLLM's free-block count equals the unreferenced blocks that are not withheld;
    * physical pages stay within the limit unless a resize is deferred or commands are in flight;
    * the CPU tier (when on) holds no more than its capacity and counts consistently.
    """
    side.table.check_integrity()
    bp, g = side.block_pool, side.geometry
    free_expected = 0
    for page, state in enumerate(side.table.state):
        for b in g.blocks_of(page):  # type: ignore[arg-type]
            blk = bp.blocks[b]
            queued = blk.prev_free_block is not None or blk.next_free_block is not None
            held = b in side.withheld
            if state is not PageState.MAPPED and (not held or queued or blk.ref_cnt):
                raise AssertionError(f"block {b} of {state.value} page {page}: withheld={held} queued={queued}")
            if state is PageState.MAPPED and page not in side.draining and held:
                raise AssertionError(f"block {b} of mapped page {page} is withheld")
            if held and queued:
                raise AssertionError(f"withheld block {b} is still in vLLM's free queue")
            free_expected += blk.ref_cnt == 0 and not held and not blk.is_null
    if bp.get_num_free_blocks() != free_expected:
        raise AssertionError(f"vLLM counts {bp.get_num_free_blocks()} free blocks, pages say {free_expected}")
    settling = side._pending.status is ResizeStatus.DEFERRED or side.inflight or side.outbox
    if side.table.physical_pages > side.table.limit_pages and not settling:
        raise AssertionError(f"{side.table.physical_pages} physical pages > limit {side.table.limit_pages}")
    if side.tier is not None:
        side.tier.check()

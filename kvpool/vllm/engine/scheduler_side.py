"""Scheduler half of the connector: decides which pages are backed, over vLLM's own BlockPool.

vLLM's ``BlockPool`` stays the allocator of record (no per-block cost is added to its hot path).
The pool steers it through its public free queue: blocks in pages that are not backed are
*withheld* (taken out of ``free_block_queue``), so vLLM can never hand them out.

    page lifecycle      UNMAPPED --map cmd--> RESERVE --ack--> MAPPED --drain--> (draining)
                           ^                  (withheld)      (in the queue)         |
                           +----------------------- ack <--- unmap cmd <-- all blocks withheld

* grow: when free blocks fall below ``grow_ahead`` and there is demand, map the lowest unmapped
  pages (within the limit); their blocks join the *front* of the free queue only once every rank
  acknowledged the map, so no forward pass can touch an unbacked page;
* shrink (resize below the mapped size, or trim): pick victim pages with the fewest used blocks,
  mark them draining; each step withholds their blocks as they become free (cached ones are
  evicted from the prefix cache first) and unmaps a page once all of its blocks are withheld.
  Until then the resize is ``deferred``; once it has waited ``preempt_after_s``, the engine's
  scheduler preempts the requests that hold those blocks (:mod:`.preemption`). With the CPU tier on, a
  cached block dropped this way is *demoted*: its copy stays in the tier (vLLM's offloading
  stores every full prompt block as it is computed), so its prefix is a tier hit afterwards. A
  block that this step's store jobs still read is not withheld until a later step.

Everything here runs on the engine-core thread: in ``build_connector_meta`` each step, and in
``has_pending_push_work`` when the engine is idle. Control requests from other threads wait in
a mailbox for that thread (see :mod:`kvpool.control`).
"""

from __future__ import annotations

import collections
import logging
import queue
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from kvpool.control.messages import Check, ControlRequest, Reply, Resize, Snapshot, Trim
from kvpool.layout import Geometry, PageId
from kvpool.limits import Limit, Verdict
from kvpool.pages import PageState, PageTable
from kvpool.snapshot import OffloadStats, PoolSnapshot, ResizeResult, ResizeStatus, TrimResult
from kvpool.vllm.engine.protocol import PageCommand, PageOp, PoolWorkerMetadata
from kvpool.vllm.engine.settings import ConnectorSettings

log = logging.getLogger(__name__)


class TierView(Protocol):
    """What the pool asks of the CPU tier (see :mod:`kvpool.vllm.tier.offloading`)."""

    def held(self, block_hash: bytes) -> bool: ...

    def loading(self, request_id: str) -> bool: ...

    def stats(self, demoted: int) -> OffloadStats: ...

    def check(self) -> None: ...


class SchedulerSide:
    """Page decisions for one engine (all tensor-parallel ranks get the same commands)."""

    def __init__(
        self, settings: ConnectorSettings, geometry: Geometry, grow_ahead: int, tier: TierView | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.settings, self.geometry, self.clock = settings, geometry, clock
        self.page_bytes = geometry.page_physical_bytes
        # floor 1 page: page 0 holds vLLM's null block and is never released
        self.limit = Limit(settings.limit_bytes, self.page_bytes, geometry.total_bytes, floor_pages=1)
        self.table = PageTable(geometry.num_pages, geometry.blocks_per_page, self.limit.pages)
        self.table.pinned.add(PageId(0))
        self.grow_ahead = grow_ahead
        self.mailbox: queue.Queue[ControlRequest] = queue.Queue()
        self.block_pool: Any = None
        self.withheld: set[int] = set()
        self.draining: set[PageId] = set()
        self.outbox: list[PageCommand] = []
        self.inflight: dict[int, PageCommand] = {}
        self._seq = 0
        self.errors: collections.deque[str] = collections.deque(maxlen=32)  #: latest failed commands
        self.tier = tier
        self.demoted = 0  #: cached blocks dropped by shrinks whose copy the tier holds
        self._busy: set[int] = set()  #: blocks this step's tier stores read: their pages stay mapped
        self._deferred_at = 0.0  #: when the pending resize was deferred (``self.clock``)
        self.shrink_preemptions = 0  #: requests the scheduler preempted for a deferred shrink
        #: blocks the first waiting request that holds blocks (a tier load's) still needs, set by the
        #: scheduler before each step: vLLM looks no request up while it blocks the queue, so without
        #: it the step saw no demand and, with nothing running, never grew the pool it waits for
        self.held_head_blocks = 0

    # ---- binding ----------------------------------------------------------------------------

    def bind(self, block_pool: Any) -> None:
        """Take over vLLM's BlockPool: withhold every block outside page 0 (the null block's)."""
        self.block_pool = block_pool
        queue_ = block_pool.free_block_queue
        for page in range(1, self.geometry.num_pages):
            for b in self.geometry.blocks_of(PageId(page)):
                queue_.remove(block_pool.blocks[b])
                self.withheld.add(b)
        self.table.set_state(PageId(0), PageState.MAPPED)

    # ---- the engine thread's entry points ----------------------------------------------------

    def step(self, scheduled_tokens: int, demand_blocks: int, busy: set[int] | None = None) -> list[PageCommand]:
        """Once per scheduler step: serve control requests, drain, grow; return the commands.

        ``demand_blocks``: blocks the largest waiting request needs (0 when none waits);
        ``busy``: blocks the tier's store jobs of this step read."""
        self._busy = busy or set()
        demand_blocks, self.held_head_blocks = max(demand_blocks, self.held_head_blocks), 0
        self.serve_mailbox()
        self._drain()
        if demand_blocks or scheduled_tokens:
            self._grow(demand_blocks)
        out, self.outbox = self.outbox, []
        self.inflight.update((c.seq, c) for c in out)
        return out

    def has_work(self) -> bool:
        """Called by the idle engine loop: serve requests now; keep stepping while commands fly."""
        self._busy = set()  # last step's stores are queued on the workers: the next fence covers them
        self.serve_mailbox()
        self._drain()
        return bool(self.outbox or self.inflight)

    def on_worker_output(self, meta: PoolWorkerMetadata | None) -> None:
        """Acknowledgements from the workers: commit acked commands, undo failed ones."""
        if meta is None:
            return
        for seq in list(self.inflight):
            if seq in meta.failed:
                self._failed(self.inflight.pop(seq), meta.failed[seq])
            elif seq in meta.done:
                self._committed(self.inflight.pop(seq))
        self._settle()

    # ---- control ------------------------------------------------------------------------------

    def serve_mailbox(self) -> None:
        while True:
            try:
                req = self.mailbox.get_nowait()
            except queue.Empty:
                return
            if req.reply.set_running_or_notify_cancel():
                try:
                    req.reply.set_result(self._serve(req))
                except Exception as e:  # reported to the caller, never kills the engine loop
                    req.reply.set_exception(e)

    def _serve(self, req: ControlRequest) -> Reply:
        match req.op:
            case Snapshot():
                return self.snapshot()
            case Resize(limit_bytes=limit, revision=revision):
                return self.resize(limit, revision)
            case Trim():
                return self.trim()
            case Check():
                self.check_integrity()
                return None

    def resize(self, limit_bytes: int, revision: int) -> ResizeResult:
        waiting = self.limit.pending.status is ResizeStatus.DEFERRED
        verdict = self.limit.request(limit_bytes, revision)
        if verdict is Verdict.NEW:
            self.table.limit_pages = self.limit.pages
            self._pick_victims(self._physical_pages() - self.table.limit_pages)
            self._drain()
            self._settle()
            self.limit.accepted()
            if not waiting:  # a new cut while one waits keeps the wait's start: the grace is per wait
                self._deferred_at = self.clock()
        return self.limit.result(verdict, self._physical_pages())

    def shrink_waits_for(self) -> set[int]:
        """The used blocks in draining pages, once a shrink has been deferred ``preempt_after_s``
        (empty before, or with preemption off): what the scheduler preempts requests to free."""
        after = self.settings.preempt_after_s
        if after is None or self.limit.pending.status is not ResizeStatus.DEFERRED:
            return set()
        if self.clock() - self._deferred_at < after:
            return set()
        bp = self.block_pool
        return {b for p in self.draining for b in self.geometry.blocks_of(p) if bp.blocks[b].ref_cnt > 0}

    def may_preempt(self, request_id: str) -> bool:
        """Not while the CPU tier loads into the request's blocks (it would write freed blocks)."""
        return not (self.tier and self.tier.loading(request_id))

    def preempted(self, requests: int, blocks: set[int]) -> None:
        """The scheduler preempted ``requests`` for the blocks ``blocks``: drop those blocks from the
        prefix cache (a resumed request must not hold them again) and withhold what the requests
        freed, before the step allocates any of it. Unmaps wait for the step (``_drain``): only it
        knows which blocks its store jobs read."""
        self.shrink_preemptions += requests
        self._forget([self.block_pool.blocks[b] for b in blocks])
        for page in self.draining:
            self._withhold(self.geometry.blocks_of(page), busy=set())

    def trim(self) -> TrimResult:
        """Drain every page that holds no used block now (cached blocks are evicted); the pages
        are unmapped once every rank acknowledges."""
        victims = [p for p in self._mapped_candidates() if self._used_in(p) == 0]
        bp = self.block_pool
        cached = sum(bp.blocks[b].block_hash is not None for p in victims for b in self.geometry.blocks_of(p))
        self.draining.update(victims)
        self._drain()
        return TrimResult(len(victims), len(victims) * self.page_bytes, cached)

    # ---- snapshot and invariants ----------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        g, bp = self.geometry, self.block_pool
        mapped_pages = [PageId(p) for p, s in enumerate(self.table.state) if s is PageState.MAPPED]
        used = cached = 0
        for page in mapped_pages:
            for b in g.blocks_of(page):
                blk = bp.blocks[b]
                used += blk.ref_cnt > 0 and not blk.is_null
                cached += blk.ref_cnt == 0 and blk.block_hash is not None
        return self.limit.snapshot(
            g,
            self.settings.model,
            len(mapped_pages),
            reserve_bytes=self.table.count(PageState.RESERVE) * self.page_bytes,
            used_blocks=used,
            cached_blocks=cached,
            free_blocks=len(mapped_pages) * g.blocks_per_page - used - cached - 1,
            offload=self.tier.stats(self.demoted) if self.tier else None,
            shrink_preemptions=self.shrink_preemptions,
        )

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant, with its numbers.

        * a block in a page that is not MAPPED (or is draining and withheld) is never in vLLM's free
          queue and never referenced; blocks of MAPPED, non-draining pages are never withheld;
        * vLLM's free-block count equals the unreferenced blocks that are not withheld;
        * physical pages stay within the limit unless a resize is deferred or commands are in flight;
        * the CPU tier (when on) holds no more than its capacity and counts consistently.
        """
        self.table.check_integrity()
        bp, g = self.block_pool, self.geometry
        free_expected = 0
        for page, state in enumerate(self.table.state):
            for b in g.blocks_of(page):  # type: ignore[arg-type]
                blk = bp.blocks[b]
                queued = blk.prev_free_block is not None or blk.next_free_block is not None
                held = b in self.withheld
                if state is not PageState.MAPPED and (not held or queued or blk.ref_cnt):
                    raise AssertionError(f"block {b} of {state.value} page {page}: withheld={held} queued={queued}")
                if state is PageState.MAPPED and page not in self.draining and held:
                    raise AssertionError(f"block {b} of mapped page {page} is withheld")
                if held and queued:
                    raise AssertionError(f"withheld block {b} is still in vLLM's free queue")
                free_expected += blk.ref_cnt == 0 and not held and not blk.is_null
        if bp.get_num_free_blocks() != free_expected:
            raise AssertionError(f"vLLM counts {bp.get_num_free_blocks()} free blocks, pages say {free_expected}")
        settling = self.limit.pending.status is ResizeStatus.DEFERRED or self.inflight or self.outbox
        if self.table.physical_pages > self.table.limit_pages and not settling:
            raise AssertionError(f"{self.table.physical_pages} physical pages > limit {self.table.limit_pages}")
        if self.tier is not None:
            self.tier.check()

    # ---- internals ------------------------------------------------------------------------------

    def _physical_pages(self) -> int:
        return self.table.physical_pages

    def _command(self, page: PageId, op: PageOp) -> None:
        self._seq += 1
        self.outbox.append(PageCommand(self._seq, page, op))

    def _grow(self, demand_blocks: int) -> None:
        free = self.block_pool.get_num_free_blocks()
        want = (
            max(self.grow_ahead, demand_blocks)
            - free
            - self.table.count(PageState.RESERVE) * self.geometry.blocks_per_page
        )
        while want > 0 and self._physical_pages() < self.table.limit_pages:
            page = self.table.unmapped_page()
            if page is None:
                return
            self.table.set_state(page, PageState.RESERVE)  # backed once acked; blocks still withheld
            self._command(page, PageOp.MAP)
            want -= self.geometry.blocks_per_page

    def _committed(self, cmd: PageCommand) -> None:
        page = PageId(cmd.page)
        blocks = self.geometry.blocks_of(page)
        if cmd.op is PageOp.MAP:
            self.table.set_state(page, PageState.MAPPED)
            self.withheld.difference_update(blocks)
            # the front of the queue: fresh pages are used before cached blocks get evicted
            self.block_pool.free_block_queue.prepend_n([self.block_pool.blocks[b] for b in blocks])
        else:
            self.table.set_state(page, PageState.UNMAPPED)

    def _failed(self, cmd: PageCommand, error: str) -> None:
        self.errors.append(f"{cmd.op.value} page {cmd.page}: {error}")
        page = PageId(cmd.page)
        if cmd.op is PageOp.MAP:  # undo on every rank (idempotent), keep the blocks withheld
            self.table.set_state(page, PageState.RESERVE)
            self._command(page, PageOp.UNMAP)
        else:  # still backed somewhere: retry the unmap next step
            self._command(page, PageOp.UNMAP)

    def _mapped_candidates(self) -> list[PageId]:
        return [
            PageId(p)
            for p, s in enumerate(self.table.state)
            if s is PageState.MAPPED and p not in self.table.pinned and p not in self.draining
        ]

    def _used_in(self, page: PageId) -> int:
        return sum(self.block_pool.blocks[b].ref_cnt > 0 for b in self.geometry.blocks_of(page))

    def _pick_victims(self, excess: int) -> None:
        excess -= len(self.draining) + sum(c.op is PageOp.UNMAP for c in self.inflight.values())
        if excess <= 0:
            return
        ranked = sorted(self._mapped_candidates(), key=lambda p: (self._used_in(p), -p))
        self.draining.update(ranked[:excess])

    def _drain(self) -> None:
        """Withhold free blocks of draining pages; unmap pages whose blocks are all withheld and
        that no store job of this step reads (the worker unmaps before it runs the step's stores)."""
        for page in sorted(self.draining):
            blocks = self.geometry.blocks_of(page)
            self._withhold(blocks, self._busy)
            if all(b in self.withheld for b in blocks) and self._busy.isdisjoint(blocks):
                self.draining.discard(page)
                self.table.set_state(page, PageState.RESERVE)  # backed until the unmap is acked
                self._command(page, PageOp.UNMAP)

    def _withhold(self, block_ids: Iterable[int], busy: set[int]) -> None:
        """Take the free blocks among ``block_ids`` (but ``busy``) out of vLLM's free queue."""
        bp = self.block_pool
        idle = [
            bp.blocks[b] for b in block_ids if bp.blocks[b].ref_cnt == 0 and b not in self.withheld and b not in busy
        ]
        self._forget(idle)
        for blk in idle:
            bp.free_block_queue.remove(blk)
            self.withheld.add(blk.block_id)

    def _forget(self, blocks: list[Any]) -> None:
        """Drop cached blocks from the prefix cache, counting those the CPU tier keeps as demoted."""
        cached = [blk for blk in blocks if blk.block_hash is not None]
        if self.tier:
            self.demoted += sum(self.tier.held(blk.block_hash) for blk in cached)
        self.block_pool.evict_blocks({blk.block_id for blk in cached})

    def _settle(self) -> None:
        """Finish a deferred resize once physical pages fit the limit and nothing is in flight."""
        if self.limit.pending.status is not ResizeStatus.DEFERRED:
            return
        excess = self._physical_pages() - self.table.limit_pages
        if excess > 0:
            self._pick_victims(excess)
            return
        self.limit.settle(self._physical_pages())

"""Preemption on shrink: the engine frees the pages a deferred shrink waits for.

A shrink below what running requests hold is *deferred* (:mod:`.scheduler_side`): its pages
drain as their requests finish. The model that the memory is for then waits for the donor's
longest running request -- seconds: in ``bench-colocation``'s bursts with the CPU tier, a model
claiming its share back waited 2.2-2.4 s for the other's eleven running requests to finish.
With ``preempt_after_s`` set, a shrink deferred that long preempts the running requests that
hold blocks in draining pages (all of them: a page drains once none does), in vLLM's order of
victims. vLLM's own recompute preemption does it (blocks freed, the request back at the head of
the waiting queue, its output kept): the request resumes from its prefix cache -- what is left
of it outside the drained pages -- or, with the CPU tier, from the tier's copies, and completes
as it would have.

vLLM has no connector hook that preempts, so this is a scheduler (vLLM's ``--scheduler-cls``):
:func:`pool_scheduler` builds one of the class vLLM would have used itself (async scheduling on
GPUs, sync on the CPU backend -- vLLM decides that after the flags are read, so one name serves
both). Before each step it asks the pool which blocks a due shrink waits for, preempts their
holders, lets the pool withhold the freed blocks before the step allocates any, and keeps the
preempted requests out of that step.

A request need not run to hold blocks: with the CPU tier, one admitted for a tier load holds the
loaded prefix while it waits, and once the load completed it waits at the head of vLLM's queue of
block holders until its remaining blocks fit -- which a cut limit may never allow. Preempting the
running holders alone then left it holding the draining pages: the shrink stayed deferred, nothing
ran, and nothing behind it was admitted (``bench-colocation`` longtail, proportional with the tier:
an engine stalled with 24 requests waiting until the run's deadline failed them). Such a waiting
holder is released too: its blocks freed, it goes back to the waiting queue as it was before its
admission, and looks its prefix up again.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from kvpool.vllm.engine.scheduler_side import SchedulerSide


class ShrinkPreemption(Scheduler):
    """A vLLM scheduler that preempts for a due shrink before it schedules a step."""

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        side = getattr(self.connector, "scheduler", None)
        if not isinstance(side, SchedulerSide):
            return super().schedule(*args, **kwargs)
        victims = self._preempt_for(side)
        if self.kv_holding_waiting:
            side.held_head_blocks = self._request_remaining_blocks(self.kv_holding_waiting.peek_request())
        if not victims:
            return super().schedule(*args, **kwargs)
        # Like vLLM's own preemption, a request preempted in a step is not resumed in it: vLLM's
        # offloading connector would see a load planned for a request it is told was preempted.
        self.waiting.remove_requests(victims)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            for request in victims:  # newest first: the oldest ends at the head of the queue
                self.waiting.prepend_request(request)

    def _preempt_for(self, side: SchedulerSide) -> list[Request]:
        waited = side.shrink_waits_for()
        if not waited:
            return []
        now = time.monotonic()
        victims = [
            r for r in self._by_preemption_order() if self._holds_any(r, waited) and side.may_preempt(r.request_id)
        ]
        for request in victims:
            self.running.remove(request)
            # vLLM's own preemption, as its schedule loop calls it; with async scheduling a block a
            # step in flight still writes is freed once that step is done (vLLM defers it)
            self._preempt_request(request, now, drop_stale_output=self.requires_kv_delivery)
        victims += [
            r
            for r in list(self.kv_holding_waiting)
            if self._holds_any(r, waited) and side.may_preempt(r.request_id) and self._release_waiting(r)
        ]
        if victims:
            side.preempted(len(victims), waited)  # withholds the freed blocks before this step allocates
        return victims

    def _release_waiting(self, request: Request) -> bool:
        """Free the blocks of a request that holds them without running (its tier load completed,
        its remaining blocks do not fit) and put it back in the waiting queue as it was before its
        admission: its status and preemption count unchanged, so a request the workers never saw is
        scheduled as new. False, and nothing done, while its load is still in flight (the load
        writes those blocks) or for a state vLLM keeps blocks in for other reasons (streaming)."""
        if request.status not in (RequestStatus.WAITING_FOR_REMOTE_KVS, RequestStatus.WAITING, RequestStatus.PREEMPTED):
            return False
        # a load that finished but was not yet seen by the schedule loop: promote it as vLLM would
        # (caches the loaded blocks, so the prefix is found again after the release)
        if not self._handle_blocked_waiting_request(request):
            return False
        self.kv_holding_waiting.remove_request(request)
        self.deferred_waiting.discard(request)
        self._free_request_blocks(request)
        self.encoder_cache_manager.free(request)
        self._inflight_prefills.discard(request)
        self._set_kv_fetch_stage(request, None)
        request.num_computed_tokens = 0
        self.waiting.prepend_request(request)
        return True

    def _by_preemption_order(self) -> list[Request]:
        """vLLM's order of victims: the lowest priority, then the latest arrival (FCFS: the newest
        running request first) -- the least work lost, the oldest finish first."""
        if self.policy == SchedulingPolicy.PRIORITY:
            return sorted(self.running, key=lambda r: (r.priority, r.arrival_time), reverse=True)
        return self.running[::-1]

    def _holds_any(self, request: Request, blocks: set[int]) -> bool:
        return any(b in blocks for group in self.kv_cache_manager.get_block_ids(request.request_id) for b in group)


class PoolScheduler(ShrinkPreemption):
    """vLLM's sync scheduler, with preemption on shrink (the CPU backend's choice)."""


class PoolAsyncScheduler(ShrinkPreemption, AsyncScheduler):
    """vLLM's async scheduler, with preemption on shrink (GPUs' default)."""


def pool_scheduler(*args: Any, **kwargs: Any) -> Scheduler:
    """What vLLM's engine core calls in place of a scheduler class: the async or the sync one, as
    its config decided."""
    config = kwargs.get("vllm_config") or args[0]
    cls = PoolAsyncScheduler if config.scheduler_config.async_scheduling else PoolScheduler
    return cls(*args, **kwargs)

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
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from kvpool.vllm.engine.scheduler_side import SchedulerSide


class ShrinkPreemption(Scheduler):
    """A vLLM scheduler that preempts for a due shrink before it schedules a step."""

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        side = getattr(self.connector, "scheduler", None)
        victims = self._preempt_for(side) if isinstance(side, SchedulerSide) else []
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
        if victims:
            side.preempted(len(victims), waited)  # withholds the freed blocks before this step allocates
        return victims

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

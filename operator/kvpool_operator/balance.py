"""One rebalancing round for one pod (one GPU): observe every model's pool, plan with the pure
policy, apply shrinks, wait until they report ``applied``, then grant -- never more than has been
released:

    observe --> plan --> PUT shrinks --> poll until applied --> PUT grows (clipped to headroom)
                                              | timeout: grows wait for a later round

Headroom counts what is *physically* held: a pool whose shrink is still deferred holds
max(limit, physical) -- physical = pages with blocks + backed pages without, those awaiting their
unmap included -- so the sum of what the pools may hold never exceeds the budget, even
mid-flight. A pool that does not answer keeps its limit and marks the round degraded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kvpool_operator.demand import plan_demand
from kvpool_operator.demand_memory import Memory
from kvpool_operator.policy import Arbitration, GroupPolicy, Infeasible, Observation, Plan, initial_limits, plan
from kvpool_operator.pools import AdminAPI, Endpoint, PoolUnreachable
from kvpool_operator.spec import GroupSpec
from kvpool_operator.wire import PoolState


@dataclass(frozen=True)
class Resize:
    model: str
    pod: str
    old_bytes: int
    new_bytes: int
    status: str  #: applied | deferred | stale | conflict | failed | timeout


@dataclass
class PodRound:
    pod: str
    snapshots: dict[str, PoolState] = field(default_factory=dict)  #: the latest read (after a shrink's wait)
    observed: dict[str, Observation] = field(default_factory=dict)  #: what the policy weighed this round
    resizes: list[Resize] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  #: unreachable servers, stuck shrinks, bad specs
    memory: Memory = field(default_factory=Memory)  #: the policy's, for the pod's next round
    #: each model's preemption counter to count the next round's from: the highest seen, so a
    #: count that dips (vLLM counts a preemption with the request's next output, the pool its own
    #: shrink preemptions at once) is not read again as new preemptions when it recovers
    preemption_marks: dict[str, int] = field(default_factory=dict)

    @property
    def balanced(self) -> bool:
        return not self.problems and all(r.status == "applied" for r in self.resizes)


def observation(snap: PoolState, last_preemptions: int) -> Observation:
    return Observation(
        limit_bytes=snap.limit_bytes,
        used_bytes=snap.used_bytes,
        waiting_requests=snap.waiting_requests,
        preemptions=max(0, snap.preemptions - last_preemptions),
        running_requests=snap.running_requests,
        page_bytes=snap.page_bytes,
        finished_total=snap.finished_requests,
    )


Arbiter = Callable[[GroupPolicy, Mapping[str, Observation], Memory], tuple[Plan | Infeasible, Memory]]
#: the seam between a round and its policy: pure functions, chosen by ``spec.rebalance.policy``
ARBITERS: dict[Arbitration, Arbiter] = {
    Arbitration.DEMAND: plan_demand,
    Arbitration.PROPORTIONAL: lambda group, observed, memory: (plan(group, observed), memory),
}


class Balancer:
    def __init__(
        self, client: AdminAPI, wait_s: float = 10.0, clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:  # fmt: skip
        self.client, self.wait_s, self.clock, self.sleep = client, wait_s, clock, sleep

    def round(
        self, group: GroupSpec, pod: str, eps: Mapping[str, Endpoint], known: Mapping[str, int],
        preemptions: Mapping[str, int], memory: Memory | None = None,
    ) -> PodRound:  # fmt: skip
        """``known``: last known limit per model (for servers that do not answer; one never reached
        is assumed to hold the limit it was started with); ``preemptions``: each model's
        preemption counter at the previous round; ``memory``: the policy's, from the pod's
        previous round (the result's ``memory`` is the next one's)."""
        out = PodRound(pod, memory=memory or Memory())
        started = initial_limits(group.policy)
        observed = out.observed
        for budget in group.policy.models:
            name = budget.name
            try:
                if name not in eps:
                    raise PoolUnreachable(f"{name}: no ready endpoint on pod {pod}")
                out.snapshots[name] = snap = self.client.snapshot(eps[name])
                observed[name] = observation(snap, preemptions.get(name, 0))
                out.preemption_marks[name] = max(preemptions.get(name, 0), snap.preemptions)
            except PoolUnreachable as e:
                out.problems.append(str(e))
                observed[name] = Observation(known.get(name, started[name]), 0, reachable=False)
        result, out.memory = ARBITERS[group.policy.arbitration](group.policy, observed, out.memory)
        if isinstance(result, Infeasible):
            out.problems.append(result.reason)
            return out
        revision = self._revision(out.snapshots.values())
        held = {n: max(o.limit_bytes, _physical(out.snapshots.get(n))) for n, o in observed.items()}
        for name in result.shrinks:
            held[name] = self._shrink(out, eps[name], observed[name].limit_bytes, result.limits[name], revision)
        headroom = group.policy.budget_bytes - sum(held.values())
        for name in result.grows:
            old = observed[name].limit_bytes
            new = min(result.limits[name], old + max(0, headroom))
            if new > old:
                status = self._set(out, eps[name], old, new, revision)
                headroom -= (new - old) if status in ("applied", "deferred") else 0
        return out

    def _revision(self, snaps: Iterable[PoolState]) -> int:
        """Monotonic per pool across operator restarts: wall-clock milliseconds, and always above
        every revision a pool has seen."""
        seen = [s.revision for s in snaps]
        return max([int(self.clock() * 1000), *[r + 1 for r in seen]])

    def _set(self, out: PodRound, ep: Endpoint, old: int, new: int, revision: int) -> str:
        try:
            status = self.client.set_limit(ep, new, revision).status
        except PoolUnreachable as e:
            out.problems.append(str(e))
            status = "failed"
        out.resizes.append(Resize(ep.model, ep.pod, old, new, status))
        return status

    def _shrink(self, out: PodRound, ep: Endpoint, old: int, new: int, revision: int) -> int:
        """Shrink and wait for ``applied``; return what the pool may still hold physically."""
        status = self._set(out, ep, old, new, revision)
        deadline = self.clock() + self.wait_s
        while status == "deferred" and self.clock() < deadline:
            self.sleep(0.1)
            try:
                snap = self.client.snapshot(ep)
            except PoolUnreachable as e:  # it died draining: what it held is not known to be free
                out.problems.append(str(e))
                status = "failed"
                break
            status = snap.status if snap.revision == revision else "stale"
            out.snapshots[ep.model] = snap
        if status != "applied":
            out.problems.append(f"{ep.model} on {ep.pod}: shrink to {new} bytes is {status}; grants wait")
            out.resizes[-1] = Resize(ep.model, ep.pod, old, new, status if status != "deferred" else "timeout")
            latest = out.snapshots.get(ep.model)
            return max(new, latest.physical_bytes) if latest else old
        out.resizes[-1] = Resize(ep.model, ep.pod, old, new, "applied")
        return new


def _physical(snap: PoolState | None) -> int:
    return snap.physical_bytes if snap else 0

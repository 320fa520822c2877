"""The spread policy: the proportional policy's split (``kvpool_operator.policy.plan``), planned
only in a round where memory hurts a model. Pure: (group, observations, memory of earlier rounds)
-> (plan, new memory), the demand policy's memory (``demand_memory``) carried between rounds.

Why: seed by seed, over the runs of stops 47-50, the proportional policy's p99 TTFT was as low as
the demand policy's or lower (demand the lower in 11 of 28 seeds), but on a steady load it moved
limits 54 times a model a minute, preempting requests for its shrinks, and made that load's p99
1.2x a static split's: utilisation rises with any load, and one round's queue of one or two adds
to a model's pressure, so its targets moved every round. The demand policy moved nothing there.
Its gate is what the steady load needs; the proportional split is what the bursts and ramps liked.

    a round plans   the proportional split   if it grows a model hurt now (``demand_memory.hurts``:
                                             short two rounds with a deep queue, a burst's
                                             queue, stalled, or short below its share beside
                                             an idle loan), or a limit is out of bounds
                    nothing                  otherwise -- limits stay where the last split left them

``minDwellSeconds`` plays no part here: the gate, not a dwell, holds a steady load's limits.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvpool_operator.demand_memory import Memory, hurts, recall
from kvpool_operator.policy import GroupPolicy, Infeasible, Observation, Plan, check_feasible, plan


def plan_spread(
    group: GroupPolicy, observed: Mapping[str, Observation], memory: Memory
) -> tuple[Plan | Infeasible, Memory]:
    """One round: remember, then the proportional plan if it grows a model that memory hurts (or
    puts limits back in bounds), else no move."""
    problem = check_feasible(group, observed)
    if problem is not None:
        return problem, memory
    now, mems, _ = recall(group, observed, memory)
    result = plan(group, observed)
    if isinstance(result, Infeasible) or _out_of_bounds(group, observed):
        return result, Memory(now, mems)
    # Only a grow of a hurt model opens the round: a hurt model at its maximum (nothing to gain) or
    # one the split would shrink (its queue's pressure fell below another's) must not set every
    # other limit following the split's round-to-round jitter.
    if any(hurts(mems[n]) for n in result.grows):
        return result, Memory(now, mems)
    return Plan({m.name: observed[m.name].limit_bytes for m in group.models}, (), ()), Memory(now, mems)


def _out_of_bounds(group: GroupPolicy, observed: Mapping[str, Observation]) -> bool:
    """A limit below its model's minimum (by a page: a pool holds whole pages, ``Observation.below``)
    or above its maximum, or limits over the budget (a spec change): the proportional plan puts
    them back whatever the load."""
    seen = [(m, observed[m.name]) for m in group.models if observed[m.name].reachable]
    outside = any(obs.below(m.min_bytes) or obs.limit_bytes > m.max_bytes for m, obs in seen)
    return outside or sum(obs.limit_bytes for obs in observed.values()) > group.budget_bytes

"""The demand policy: move memory only where it hurts now, one move per round, never below what
a model is using. Pure: (group, observations, memory of earlier rounds) -> (plan, new memory).

Why not utilisation (the proportional policy, ``kvpool_operator.policy.plan``): a pool fills up
under any load, so utilisation says "busy", not "short of memory"; acting on it moved limits
8 -> 12 -> 8 MiB in consecutive rounds. Here a model is *short* when requests wait and its pool
cannot take one more (nothing runs, or less than a request's bytes is left) or when it preempted
-- waiting beside room to spare means the engine is short of compute, not memory; its *need* is
what it holds plus what its waiting requests would hold:

    need_i   = max(working set, EWMA of (used + waiting x bytes per running request)) x 1.1
    target_i = water-fill of the budget by need (weights break contention; min/max hold)
    a move   = donor -> recipient, at most max_step, at least hysteresis:
               recipient: the short model furthest below its target (free budget first)
               donor:     the model furthest above its target, that has not grown for
                          ``dwell_rounds`` -- and never below its target, so never below its
                          working set unless the budget is contested

Against flapping: a model must be short two rounds in a row, with two or more requests waiting
on average, before it is granted (a Poisson spike of a steady load is not a trend; a burst's
queue of tens is), and no model reverses within its dwell (one that grew is not a donor, one
that shrank is not a recipient). A spec change that leaves limits above a maximum or over the budget is undone first, by
shrinks alone (the Balancer applies them before any grant). Fast grow, slower shrink: the EWMA rises with alpha 0.7 and
decays with 0.5; the working set (the recent peak of what a model used) decays 15% a round, so
a donor keeps its recent high-water mark unless the budget is contested -- giving a steady load's
memory away down to its momentary use made it short a few seconds later (12 moves a minute).
A move is at least one of the recipient's requests (and the hysteresis): smaller ones were
fix-ups that a Poisson load undoes.

Objective: the distance of the limits from the water-filled targets (the max-min fair split of
need), sum |limit - target|. A move takes at most the donor's excess over its target and gives
at most the recipient's shortfall, so every move lowers it by twice the bytes moved (once from
free budget); a round with no such move worth the hysteresis plans nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kvpool_operator.policy import (
    GroupPolicy,
    Infeasible,
    ModelBudget,
    Observation,
    Plan,
    check_feasible,
    water_fill,
)

RISE, DECAY, WORKING_SET_DECAY, HEADROOM = 0.7, 0.5, 0.85, 1.1
PERSIST = 2  #: rounds in a row a model must be short before it is granted memory
QUEUE = 2.0  #: ... with at least this many requests waiting on average (EWMA, alpha 0.5)
FULL = 0.75  #: a pool this full with requests waiting is short of memory


@dataclass(frozen=True)
class ModelMemory:
    """What the policy remembers of one model between rounds."""

    need_ewma: float = 0.0
    working_set: float = 0.0
    per_request: float = 0.0  #: bytes a running request holds (EWMA); 0 until one ran
    last_grow: int = -(10**9)  #: round of the latest grant
    last_shrink: int = -(10**9)  #: round of the latest shrink
    short_rounds: int = 0  #: consecutive rounds short of memory, this one included
    waiting_ewma: float = 0.0  #: requests waiting (and preempted), smoothed


@dataclass(frozen=True)
class Memory:
    round: int = 0
    models: Mapping[str, ModelMemory] = field(default_factory=dict)


def short_of_memory(obs: Observation, per_request: float) -> bool:
    """Requests wait and the pool cannot take one more -- nothing runs, or the room left is under
    one request's bytes or a quarter of the limit -- or the engine preempted. Requests waiting
    beside room to spare mean the engine is short of compute, not memory."""
    if obs.preemptions > 0:
        return True
    if obs.waiting_requests == 0:
        return False
    room = obs.limit_bytes - obs.used_bytes
    return obs.running_requests == 0 or room < max(per_request, (1 - FULL) * obs.limit_bytes)


def remember(prev: ModelMemory, obs: Observation, default_per_request: float) -> ModelMemory:
    """Fold one observation into a model's memory. Until a request of its own has run, a model's
    requests are assumed to be ``default_per_request`` bytes (the group's largest seen)."""
    per = prev.per_request
    if obs.running_requests > 0 and obs.used_bytes > 0:
        now = obs.used_bytes / obs.running_requests
        per = now if per == 0 else 0.5 * per + 0.5 * now
    assumed = per or default_per_request
    short = short_of_memory(obs, assumed)
    wanted = obs.used_bytes + (obs.waiting_requests + obs.preemptions) * assumed if short else obs.used_bytes
    alpha = RISE if wanted > prev.need_ewma else DECAY
    need = prev.need_ewma + alpha * (wanted - prev.need_ewma)
    working = max(float(obs.used_bytes), prev.working_set * WORKING_SET_DECAY)
    streak = prev.short_rounds + 1 if short else 0
    queue = 0.5 * prev.waiting_ewma + 0.5 * (obs.waiting_requests + obs.preemptions)
    return replace(prev, need_ewma=need, working_set=working, per_request=per, short_rounds=streak,
                   waiting_ewma=queue)  # fmt: skip


def need(m: ModelBudget, mem: ModelMemory) -> int:
    return max(m.min_bytes, min(m.max_bytes, int(max(mem.working_set, mem.need_ewma) * HEADROOM)))


def targets(models: list[ModelBudget], needs: Mapping[str, int], budget: int) -> dict[str, int]:
    """Everyone's need if the budget allows; otherwise minimums first, then the rest by weight,
    no one above its need (what one cannot use goes to the others)."""
    return water_fill(models, {m.name: m.weight for m in models}, needs, budget)


def plan_demand(
    group: GroupPolicy, observed: Mapping[str, Observation], memory: Memory
) -> tuple[Plan | Infeasible, Memory]:
    """One round: remember, then at most one move (see the module docstring)."""
    problem = check_feasible(group, observed)
    if problem is not None:
        return problem, memory
    now = memory.round + 1
    seen = [mem.per_request for mem in memory.models.values() if mem.per_request > 0]
    default = max(seen, default=group.budget_bytes / (4 * len(group.models)))
    mems = {m.name: remember(memory.models.get(m.name, ModelMemory()), observed[m.name], default) for m in group.models}
    old = {m.name: observed[m.name].limit_bytes for m in group.models}
    active = [m for m in group.models if observed[m.name].reachable]
    pinned = sum(old[m.name] for m in group.models if not observed[m.name].reachable)
    target = targets(active, {m.name: need(m, mems[m.name]) for m in active}, group.budget_bytes - pinned)
    restored = _restore(group, active, old, target)
    if restored is not None:  # a spec change put limits above a maximum or the budget: fix that first
        shrinks = tuple(n for n in restored if restored[n] < old[n])
        return Plan(restored, shrinks, ()), Memory(now, mems)
    new = dict(old)
    move = _one_move(group, active, observed, target, mems, now, group.budget_bytes - sum(old.values()), default)
    if move is not None:
        donor, recipient, amount = move
        if donor is not None:
            new[donor] -= amount
            mems[donor] = replace(mems[donor], last_shrink=now)
        new[recipient] += amount
        mems[recipient] = replace(mems[recipient], last_grow=now)
    shrinks = tuple(n for n in new if new[n] < old[n])
    grows = tuple(n for n in new if new[n] > old[n])
    return Plan(new, shrinks, grows), Memory(now, mems)


def _restore(
    group: GroupPolicy, active: list[ModelBudget], old: Mapping[str, int], target: Mapping[str, int]
) -> dict[str, int] | None:
    """Limits back under every maximum and within the budget, by shrinks alone: the model
    furthest above its target first, down to its target, then toward its minimum. None when
    nothing is out of bounds (the usual round)."""
    new = dict(old)
    for m in active:
        new[m.name] = min(new[m.name], m.max_bytes)
    over = sum(new.values()) - group.budget_bytes
    for floor in (target, {m.name: m.min_bytes for m in active}):
        for m in sorted(active, key=lambda m: new[m.name] - floor[m.name], reverse=True):
            cut = min(max(over, 0), max(0, new[m.name] - floor[m.name]))
            new[m.name] -= cut
            over -= cut
    return new if new != dict(old) else None


def _wants(mem: ModelMemory, now: int, dwell: int) -> bool:
    """Short long enough, with a queue deep enough, and not shrunk within its dwell."""
    return mem.short_rounds >= PERSIST and mem.waiting_ewma >= QUEUE and now - mem.last_shrink > dwell


def _one_move(
    group: GroupPolicy, active: list[ModelBudget], observed: Mapping[str, Observation], target: Mapping[str, int],
    mems: Mapping[str, ModelMemory], now: int, free: int, default: float,
) -> tuple[str | None, str, int] | None:  # fmt: skip
    """(donor or None for free budget, recipient, bytes), or None when no move is worth it."""
    limit = {m.name: observed[m.name].limit_bytes for m in active}
    short = [m for m in active if target[m.name] > limit[m.name] and _wants(mems[m.name], now, group.dwell_rounds)]
    out_of_bounds = [m for m in active if limit[m.name] < m.min_bytes]
    wanting = out_of_bounds or short
    if not wanting:
        return None
    recipient = max(wanting, key=lambda m: (target[m.name] - limit[m.name]) * m.weight)
    deficit = min(target[recipient.name], recipient.max_bytes) - limit[recipient.name]
    grant = min(deficit, free, group.max_step_bytes)
    if free > 0 and (grant >= group.hysteresis_bytes or grant == deficit):
        return None, recipient.name, grant
    donors = [
        m for m in active
        if m is not recipient and limit[m.name] > target[m.name] and now - mems[m.name].last_grow > group.dwell_rounds
    ]  # fmt: skip
    if not donors:
        return None
    donor = max(donors, key=lambda m: limit[m.name] - target[m.name])
    amount = min(deficit, limit[donor.name] - target[donor.name], group.max_step_bytes)
    worth = max(group.hysteresis_bytes, mems[recipient.name].per_request or default)
    if amount < worth and limit[recipient.name] >= recipient.min_bytes:
        return None
    return donor.name, recipient.name, max(0, amount)

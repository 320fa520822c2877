"""The types every rebalancing policy shares, and the proportional policy: one pure function from
(group spec, what each pool reported) to new limits. No I/O, no clock, no Kubernetes -- tested
exhaustively with hypothesis. The default policy is ``kvpool_operator.demand``; this one stays
selectable (``spec.rebalance.policy: proportional``) and is the benchmark's "current policy".

    budget  |<- min_a ->|<- min_b ->|<-------- shared by demand -------->|
    targets  min_i + share_i,  share_i ~ weight_i * pressure_i   (water-filled under max_i)
    limits   old_i moved toward target_i by at most max_step, ignored within hysteresis

Pressure of a model: how full its pool is (used / limit), plus waiting requests and preemptions
(both mean "it wanted more than it had"). A model whose pool did not answer keeps its limit and
takes no part. Shrinks are listed apart from grows: the caller applies shrinks, waits until they
report ``applied``, then grants -- so the sum of limits never exceeds the budget, even mid-flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

MiB = 1 << 20


@dataclass(frozen=True)
class ModelBudget:
    name: str
    min_bytes: int
    max_bytes: int
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_bytes <= self.max_bytes:
            raise ValueError(f"model {self.name}: need 0 <= minBytes ({self.min_bytes}) <= maxBytes ({self.max_bytes})")
        if self.weight <= 0:
            raise ValueError(f"model {self.name}: weight must be > 0, got {self.weight}")


class Arbitration(Enum):
    """Which policy plans a group's rounds (``spec.rebalance.policy``)."""

    DEMAND = "demand"  #: kvpool_operator.demand: one move a round, where memory is short (default)
    PROPORTIONAL = "proportional"  #: this module's plan: every limit toward a utilisation share


@dataclass(frozen=True)
class GroupPolicy:
    budget_bytes: int
    models: tuple[ModelBudget, ...]
    hysteresis_bytes: int = 64 * MiB
    max_step_bytes: int = 1 << 30
    dwell_rounds: int = 5  #: demand policy: a grant held (unless the load left), the working-set window
    arbitration: Arbitration = Arbitration.DEMAND

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if self.budget_bytes < 0 or self.hysteresis_bytes < 0 or self.max_step_bytes <= 0:
            raise ValueError("budgetBytes and hysteresisBytes must be >= 0 and maxStepBytes > 0")
        if self.dwell_rounds < 0:
            raise ValueError(f"dwell_rounds must be >= 0, got {self.dwell_rounds}")


@dataclass(frozen=True)
class Observation:
    """One pool's report (GET /kvpool), reduced to what the policy weighs."""

    limit_bytes: int
    used_bytes: int
    waiting_requests: int = 0
    preemptions: int = 0  #: since the previous round
    reachable: bool = True
    running_requests: int = 0
    page_bytes: int = 1  #: the pool's limit is whole pages: a minimum between two pages is met at the lower
    finished_total: int = 0  #: requests the engine finished so far (a counter; the demand policy takes rates)

    def below(self, min_bytes: int) -> bool:
        """Under ``min_bytes`` by a page or more: a pool rounds a limit down to whole pages, so a
        minimum that is not a multiple of them is met at the page below it (granting the rest
        again every round moved nothing: the pool rounded it away)."""
        return self.limit_bytes < min_bytes // self.page_bytes * self.page_bytes


@dataclass(frozen=True)
class Plan:
    limits: dict[str, int]  #: the new limit of every model
    shrinks: tuple[str, ...]  #: apply these first and wait until applied ...
    grows: tuple[str, ...]  #: ... then these


@dataclass(frozen=True)
class Infeasible:
    reason: str  #: what to fix in the spec


def initial_limits(group: GroupPolicy) -> dict[str, int]:
    """Start-up limits: every minimum, then the rest of the budget split by weight under each max."""
    spare = group.budget_bytes - sum(m.min_bytes for m in group.models)
    total_weight = sum(m.weight for m in group.models)
    return {m.name: min(m.max_bytes, m.min_bytes + int(spare * m.weight / total_weight)) for m in group.models}


def pressure(obs: Observation) -> float:
    """How much a model wants memory: utilisation, plus a unit per waiting request and preemption
    (capped so one burst cannot take everything)."""
    util = obs.used_bytes / obs.limit_bytes if obs.limit_bytes else 1.0
    return min(util, 1.0) + min(obs.waiting_requests + obs.preemptions, 8) * 0.5 + 0.05


def check_feasible(group: GroupPolicy, observed: Mapping[str, Observation]) -> Infeasible | None:
    """What makes any plan impossible: minimums above the budget, a model not observed."""
    floor = sum(m.min_bytes for m in group.models)
    if floor > group.budget_bytes:
        return Infeasible(
            f"the models' minimums add up to {floor} bytes, more than the group budget of {group.budget_bytes}: "
            "lower a minBytes or raise budgetBytes"
        )
    missing = [m.name for m in group.models if m.name not in observed]
    if missing:
        return Infeasible(f"no observation for models {missing}")
    return None


def plan(group: GroupPolicy, observed: Mapping[str, Observation]) -> Plan | Infeasible:
    """New limits for one rebalancing round (see the module docstring)."""
    problem = check_feasible(group, observed)
    if problem is not None:
        return problem
    old = {m.name: observed[m.name].limit_bytes for m in group.models}
    pinned = {m.name for m in group.models if not observed[m.name].reachable}
    free = group.budget_bytes - sum(old[n] for n in pinned)
    active = [m for m in group.models if m.name not in pinned]
    targets = _water_fill(active, {m.name: pressure(observed[m.name]) for m in active}, free)
    new = dict(old)
    for m in active:
        step = max(-group.max_step_bytes, min(group.max_step_bytes, targets[m.name] - old[m.name]))
        moved = old[m.name] + step
        in_bounds = m.min_bytes <= old[m.name] <= m.max_bytes
        if abs(step) >= group.hysteresis_bytes or not in_bounds:
            new[m.name] = max(m.min_bytes, min(m.max_bytes, moved))
    _fit_budget(new, old, group, pinned)
    shrinks = tuple(n for n in new if new[n] < old[n])
    grows = tuple(n for n in new if new[n] > old[n])
    return Plan(new, shrinks, grows)


def _water_fill(models: Sequence[ModelBudget], press: Mapping[str, float], budget: int) -> dict[str, int]:
    """Minimums first, then the rest by weight x pressure; a model at its maximum gives its
    surplus back to the others."""
    weights = {m.name: m.weight * press[m.name] for m in models}
    return water_fill(models, weights, {m.name: m.max_bytes for m in models}, budget)


def water_fill(models: Sequence[ModelBudget], weight: Mapping[str, float], cap: Mapping[str, int],
               budget: int) -> dict[str, int]:  # fmt: skip
    """Every minimum, then the rest of ``budget`` shared by ``weight``, no model above its ``cap``
    (what a capped model cannot take goes to the others). Both policies split memory with it."""
    target = {m.name: m.min_bytes for m in models}
    open_ = [m for m in models if cap[m.name] > target[m.name]]
    left = budget - sum(target.values())
    while left > 0 and open_:
        total = sum(weight[m.name] for m in open_)
        capped = []
        given = 0
        for m in open_:
            take = min(int(left * weight[m.name] / total), cap[m.name] - target[m.name])
            target[m.name] += take
            given += take
            if target[m.name] >= cap[m.name]:
                capped.append(m)
        left -= given
        open_ = [m for m in open_ if m not in capped]
        if not capped:
            break  # rounding leftovers only
    return target


def fair_shares(models: Sequence[ModelBudget], budget: int) -> dict[str, int]:
    """What a static split by weight would give each model: minimums first, no one above its
    maximum (what a capped model cannot take goes to the others)."""
    return water_fill(models, {m.name: m.weight for m in models}, {m.name: m.max_bytes for m in models}, budget)


def _fit_budget(new: dict[str, int], old: Mapping[str, int], group: GroupPolicy, pinned: set[str]) -> None:
    """Trim grows (largest first) until the sum fits: hysteresis and max-step rounding must never
    push the group over its budget."""
    mins = {m.name: m.min_bytes for m in group.models}
    over = sum(new.values()) - group.budget_bytes
    for name in sorted(new, key=lambda n: new[n] - old[n], reverse=True):
        if over <= 0:
            return
        if name in pinned:
            continue
        cut = min(over, new[name] - max(mins[name], min(old[name], new[name])))
        if cut <= 0:
            cut = min(over, new[name] - mins[name])
        new[name] -= max(cut, 0)
        over -= max(cut, 0)


def restore_bounds(
    group: GroupPolicy, active: Sequence[ModelBudget], old: Mapping[str, int], target: Mapping[str, int]
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

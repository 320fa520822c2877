"""Driving the demand policy round after round in the tests: small groups and a load model."""

from __future__ import annotations

from kvpool_operator.demand import plan_demand
from kvpool_operator.demand_memory import Memory
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation, Plan

MiB = 1 << 20


def two_models(dwell: int = 3) -> GroupPolicy:
    return GroupPolicy(64 * MiB, (ModelBudget("a", 8 * MiB, 56 * MiB), ModelBudget("b", 8 * MiB, 56 * MiB)),
                       hysteresis_bytes=2 * MiB, max_step_bytes=16 * MiB, dwell_rounds=dwell)  # fmt: skip


def small_pair(dwell: int) -> GroupPolicy:
    """16 MiB between two models of 1-15 MiB: shares of a few 2-MiB requests."""
    return GroupPolicy(16 * MiB, (ModelBudget("a", MiB, 15 * MiB), ModelBudget("b", MiB, 15 * MiB)),
                       hysteresis_bytes=MiB // 2, max_step_bytes=8 * MiB, dwell_rounds=dwell)  # fmt: skip


def run(group: GroupPolicy, load: dict[str, int], rounds: int, limits: dict[str, int], memory: Memory | None = None,
        request: int = 2 * MiB, page: int = 1) -> tuple[dict[str, int], Memory, int]:  # fmt: skip
    """``load``: model -> requests in the engine; each holds ``request`` bytes (2 MiB), those that
    do not fit wait, and every running one finishes within the round (another takes its place).
    Each pool holds its limit in whole ``page``-byte pages (1: any byte)."""
    memory, moves = memory or Memory(), 0
    for _ in range(rounds):
        observed = {}
        for n, want in load.items():
            running = min(want, limits[n] // request)
            seen = memory.models[n].finished_seen or 0 if n in memory.models else 0
            observed[n] = Observation(limits[n], request * running, want - running, running_requests=running,
                                      page_bytes=page, finished_total=seen + running)  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        moves += bool(result.grows)
        limits = result.limits
    return limits, memory, moves


def three_models(dwell: int) -> GroupPolicy:
    """Fair shares of 32 MiB each."""
    return GroupPolicy(96 * MiB, tuple(ModelBudget(n, 8 * MiB, 80 * MiB) for n in "abc"),
                       hysteresis_bytes=2 * MiB, max_step_bytes=16 * MiB, dwell_rounds=dwell)  # fmt: skip

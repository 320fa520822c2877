"""The spread policy (pure): the proportional split, planned only where memory hurts a model --
a load whose queue flickers moves nothing, a burst gets the proportional split in its first round,
limits out of bounds are put back whatever the load, and the budget and bounds always hold."""

from __future__ import annotations

from hypothesis import given, settings
from kvpool_operator.demand_memory import Memory, hurts
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation, Plan, plan
from kvpool_operator.spread import plan_spread

from tests.operator.demand_rounds import MiB, run, small_pair
from tests.operator.test_demand import Rounds, observe, scenarios, starting_limits


def flickering(arbiter: object, rounds: int) -> int:
    """Moves over ``rounds`` of a steady pair whose first model's queue flickers: five requests of
    2 MiB (four fit its 8-MiB share, one waits) every other round, three in the rest."""
    group, limits, memory, moves = small_pair(dwell=5), {"a": 8 * MiB, "b": 8 * MiB}, Memory(), 0
    for i in range(rounds):
        load = {"a": 5 if i % 2 else 3, "b": 2}
        limits, memory, moved = run(group, load, 1, limits, memory, arbiter=arbiter)  # type: ignore[arg-type]
        moves += moved
    return moves


def test_a_queue_that_flickers_moves_nothing_where_the_proportional_split_moves_every_round() -> None:
    def proportional(group: GroupPolicy, observed: dict[str, Observation], memory: Memory) -> tuple[Plan, Memory]:
        result = plan(group, observed)
        assert isinstance(result, Plan)
        return result, memory

    assert flickering(plan_spread, 30) == 0
    assert flickering(proportional, 30) >= 10  # the flapping this policy's gate is for


def test_a_burst_gets_the_proportional_split_in_its_first_round() -> None:
    group = small_pair(dwell=5)
    observed = {
        "a": Observation(8 * MiB, 8 * MiB, 8, running_requests=4),  # a burst's queue, the pool full
        "b": Observation(8 * MiB, 2 * MiB, 0, running_requests=1),
    }
    result, memory = plan_spread(group, observed, Memory())
    assert hurts(memory.models["a"])
    assert result == plan(group, observed)
    assert isinstance(result, Plan)
    assert result.grows == ("a",)
    assert result.shrinks == ("b",)


def test_limits_out_of_bounds_are_put_back_on_a_calm_round() -> None:
    group = GroupPolicy(16 * MiB, (ModelBudget("a", MiB, 6 * MiB), ModelBudget("b", MiB, 15 * MiB)),
                        hysteresis_bytes=MiB // 2, max_step_bytes=8 * MiB)  # fmt: skip
    observed = {"a": Observation(8 * MiB, 0), "b": Observation(8 * MiB, 0)}  # a above its new maximum
    result, _ = plan_spread(group, observed, Memory())
    assert isinstance(result, Plan)
    assert result.limits["a"] <= 6 * MiB
    assert "a" in result.shrinks


def test_a_model_at_its_maximum_with_a_steady_queue_moves_nothing() -> None:
    """Its queue hurts, but the split has nothing to give it: the other model's limit must not
    follow the split's jitter round after round."""
    group = GroupPolicy(16 * MiB, (ModelBudget("a", MiB, 12 * MiB), ModelBudget("b", MiB, 15 * MiB)),
                        hysteresis_bytes=MiB // 2, max_step_bytes=8 * MiB)  # fmt: skip
    limits, memory, moves = {"a": 12 * MiB, "b": 4 * MiB}, Memory(), 0
    for i in range(20):
        limits, memory, moved = run(group, {"a": 9, "b": 1 + i % 2}, 1, limits, memory, arbiter=plan_spread)
        assert hurts(memory.models["a"]) or i < 1
        moves += moved
    assert moves == 0
    assert limits == {"a": 12 * MiB, "b": 4 * MiB}


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_budget_and_bounds_hold_and_only_a_hurt_round_moves(case: tuple[GroupPolicy, Rounds]) -> None:
    group, rounds = case
    limits, memory = starting_limits(group), Memory()
    for loads in rounds:
        observed = observe(limits, loads)
        result, memory = plan_spread(group, observed, memory)
        assert isinstance(result, Plan)
        assert sum(result.limits.values()) <= group.budget_bytes
        for m in group.models:
            new, old = result.limits[m.name], limits[m.name]
            assert m.min_bytes <= new <= m.max_bytes
            assert abs(new - old) <= group.max_step_bytes
            if not observed[m.name].reachable:
                assert new == old
        in_bounds = all(m.min_bytes <= limits[m.name] <= m.max_bytes for m in group.models)
        if (result.grows or result.shrinks) and in_bounds:
            assert any(hurts(memory.models[n]) for n in result.grows)
        limits = result.limits

"""The demand policy (pure): the budget and every bound hold, at most one move a round and only
toward a model short of memory, a donor never below its need unless the budget is contested, a
steady load stops moving memory (no flapping), a burst gets memory within rounds, and every move
lowers the modelled objective (the distance from the fair targets, and below the fair shares)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kvpool_operator.demand import fair_shares, need, needs_of, plan_demand, targets
from kvpool_operator.demand_memory import PERSIST, QUIET, SURGE, Memory
from kvpool_operator.policy import GroupPolicy, Infeasible, ModelBudget, Observation, Plan

from tests.operator.demand_rounds import MiB, run, three_models, two_models


@dataclass(frozen=True)
class Load:
    """One model's load in one round; its observation follows from the limit the plans left."""

    fill: float  #: used / limit
    running: int
    waiting: int
    preemptions: int
    reachable: bool

    def observe(self, limit: int) -> Observation:
        return Observation(limit, int(limit * self.fill), self.waiting, self.preemptions, self.reachable, self.running)


Rounds = list[dict[str, Load]]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[GroupPolicy, Rounds]:
    n = draw(st.integers(1, 4))
    budget = draw(st.integers(64, 2048)) * MiB
    models = []
    for i in range(n):
        lo = draw(st.integers(0, budget // n // MiB)) * MiB
        models.append(ModelBudget(f"m{i}", lo, lo + draw(st.integers(0, 2048)) * MiB, draw(st.floats(0.1, 10))))
    group = GroupPolicy(budget, tuple(models), draw(st.integers(0, 64)) * MiB, draw(st.integers(1, 512)) * MiB,
                        dwell_rounds=draw(st.integers(0, 5)))  # fmt: skip
    load = st.builds(Load, st.floats(0, 1), st.integers(0, 20), st.integers(0, 8), st.integers(0, 3), st.booleans())
    rounds = [{m.name: draw(load) for m in models} for _ in range(draw(st.integers(1, 6)))]
    return group, rounds


def starting_limits(group: GroupPolicy) -> dict[str, int]:
    """Every minimum, then half of what each may take beyond it while the budget lasts."""
    room = group.budget_bytes - sum(m.min_bytes for m in group.models)
    out = {}
    for m in group.models:
        extra = min(room, m.max_bytes - m.min_bytes) // 2
        out[m.name] = m.min_bytes + extra
        room -= extra
    return out


def observe(limits: dict[str, int], loads: dict[str, Load]) -> dict[str, Observation]:
    return {n: load.observe(limits[n]) for n, load in loads.items()}


def objective(group: GroupPolicy, observed: dict[str, Observation], memory: Memory, limits: dict[str, int]) -> int:
    """The policy's objective: how far the limits are from the water-filled targets, plus how far
    each model is below its fair share (or its target, if less)."""
    active = [m for m in group.models if observed[m.name].reachable]
    pinned = sum(limits[m.name] for m in group.models if not observed[m.name].reachable)
    limits_seen = {m.name: observed[m.name].limit_bytes for m in active}
    needs, wanted, _ = needs_of(active, memory.models, group.budget_bytes - pinned, limits_seen)
    target = targets(active, needs, wanted, group.budget_bytes - pinned)
    fair = fair_shares(active, group.budget_bytes - pinned)
    distance = sum(abs(limits[m.name] - target[m.name]) for m in active)
    return distance + sum(max(0, min(fair[m.name], target[m.name]) - limits[m.name]) for m in active)


Step = tuple[dict[str, Observation], Plan, Memory, dict[str, int]]


def rollout(group: GroupPolicy, rounds: Rounds) -> Iterator[Step]:
    """Plan round after round, each round's limits the previous plan's: (observed, plan, memory,
    limits before the plan)."""
    limits, memory = starting_limits(group), Memory()
    for loads in rounds:
        observed = observe(limits, loads)
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        yield observed, result, memory, limits
        limits = result.limits


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_budget_and_bounds_hold_with_at_most_one_move_toward_a_short_model(
    case: tuple[GroupPolicy, Rounds],
) -> None:
    group, rounds = case
    for observed, result, memory, limits in rollout(group, rounds):
        assert sum(result.limits.values()) <= group.budget_bytes
        assert len(result.shrinks) <= 1
        assert len(result.grows) <= 1
        assert set(result.shrinks).isdisjoint(result.grows)
        for m in group.models:
            new, old, obs = result.limits[m.name], limits[m.name], observed[m.name]
            assert m.min_bytes <= new <= m.max_bytes
            assert abs(new - old) <= group.max_step_bytes
            if new > old:
                assert obs.reachable
                mem = memory.models[m.name]
                assert (mem.short_rounds >= PERSIST and mem.deep) or mem.surge or old < m.min_bytes
            if not obs.reachable:
                assert new == old
        if result.grows:  # every move brings the limits closer to the fair targets
            assert objective(group, observed, memory, result.limits) < objective(group, observed, memory, limits)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_a_donor_keeps_its_need_while_the_budget_covers_every_need(
    case: tuple[GroupPolicy, Rounds],
) -> None:
    """A burst or a ramp needs at least its fair share: a static split's guarantee comes before
    another model's need above its own share."""
    group, rounds = case
    for observed, result, memory, limits in rollout(group, rounds):
        active = [m for m in group.models if observed[m.name].reachable]
        pinned = sum(limits[m.name] for m in group.models if not observed[m.name].reachable)  # they keep their limits
        fair = fair_shares(active, group.budget_bytes - pinned)
        needs = {m.name: max(need(m, mem), fair[m.name]) if mem.surge or mem.ramp else need(m, mem)
                 for m in active for mem in [memory.models[m.name]]}  # fmt: skip
        if sum(needs.values()) <= group.budget_bytes - pinned:
            for name in result.shrinks:
                assert result.limits[name] >= needs[name]


def test_a_burst_gets_memory_within_rounds_and_the_idle_model_keeps_its_working_set() -> None:
    group = two_models()
    limits, _, _ = run(group, {"a": 28, "b": 3}, 6, {"a": 32 * MiB, "b": 32 * MiB})
    assert limits["a"] >= 48 * MiB
    assert limits["b"] >= int(3 * 2 * MiB * 1.1)  # its 3 running requests keep their room


def test_a_steady_load_stops_moving_memory() -> None:
    group = two_models()
    limits, memory, first = run(group, {"a": 26, "b": 4}, 10, {"a": 32 * MiB, "b": 32 * MiB})
    _, _, later = run(group, {"a": 26, "b": 4}, 60, limits, memory)
    assert first >= 1
    assert later == 0


def test_a_model_that_just_grew_and_stays_busy_keeps_its_grant_within_its_dwell() -> None:
    """b, short at its fair share, waits out a's dwell: a's grant above its share is not taken
    back while a still uses it (only a model below its share may, see the next test)."""
    group = three_models(dwell=4)
    limits, memory, _ = run(group, {"a": 26, "b": 14, "c": 0}, 3, {"a": 40 * MiB, "b": 32 * MiB, "c": 24 * MiB})
    before = limits["a"]
    assert before > 32 * MiB
    assert limits["b"] == 32 * MiB
    busy = before // (2 * MiB) * 3 // 4  # a's load ebbs but still fills three quarters of its grant
    after, _, _ = run(group, {"a": busy, "b": 26, "c": 0}, 3, limits, memory)
    assert after["a"] == before
    later, _, _ = run(group, {"a": busy, "b": 26, "c": 0}, 12, limits, memory)
    assert later["a"] < before
    assert later["b"] > limits["b"]


def test_a_model_whose_load_left_hands_its_grant_over_within_the_dwell() -> None:
    """A burst's end is a change, not noise: once a's pool has stood half empty with nothing
    waiting for ``QUIET`` rounds, b gets a's memory without waiting out a's dwell."""
    group = two_models(dwell=8)
    limits, memory, _ = run(group, {"a": 26, "b": 0}, 3, {"a": 32 * MiB, "b": 32 * MiB})
    after, _, _ = run(group, {"a": 1, "b": 26}, QUIET + 1, limits, memory)
    assert after["a"] < limits["a"]
    assert after["b"] > limits["b"]


def test_two_short_models_converge_to_their_weighted_shares() -> None:
    group = two_models()
    limits, _, _ = run(group, {"a": 40, "b": 40}, 30, {"a": 48 * MiB, "b": 16 * MiB})
    assert abs(limits["a"] - limits["b"]) <= group.hysteresis_bytes + MiB


def test_minimums_above_the_budget_are_infeasible_and_memory_is_unchanged() -> None:
    group = GroupPolicy(8 * MiB, (ModelBudget("a", 6 * MiB, 8 * MiB), ModelBudget("b", 6 * MiB, 8 * MiB)))
    result, memory = plan_demand(group, {n: Observation(4 * MiB, 0) for n in "ab"}, Memory())
    assert isinstance(result, Infeasible)
    assert "minBytes" in result.reason
    assert memory == Memory()


def test_a_model_whose_limit_holds_no_request_still_gets_memory() -> None:
    """Nothing runs and everything waits, with the pool almost empty: short of memory, not of
    compute (the benchmark once starved a model this way at its minimum)."""
    group = two_models()
    limits, _, _ = run(group, {"a": 40, "b": 0}, 8, {"a": 32 * MiB, "b": 32 * MiB})
    tiny = {"a": limits["a"], "b": group.models[1].min_bytes}
    tiny["a"] = min(tiny["a"], group.budget_bytes - tiny["b"])
    # b's requests are 3 MiB each here: its minimum (8 MiB) holds two, the rest wait
    observed = {"a": Observation(tiny["a"], tiny["a"], 10, running_requests=20),
                "b": Observation(tiny["b"], 0, 200, running_requests=0)}  # fmt: skip
    first, _ = plan_demand(group, observed, Memory())
    assert isinstance(first, Plan)
    assert first.grows == ("b",)  # a burst's queue with nothing running: granted in its first round


def test_one_short_round_with_a_small_queue_is_not_yet_a_trend() -> None:
    """b at its fair share (nothing to reclaim), three waiting: not yet, then from free budget."""
    group = two_models()
    observed = {"a": Observation(24 * MiB, 8 * MiB, 0, running_requests=4),
                "b": Observation(32 * MiB, 32 * MiB, int(SURGE) - 1, running_requests=12)}  # fmt: skip
    first, memory = plan_demand(group, observed, Memory())
    assert isinstance(first, Plan)
    assert first.grows == ()
    second, _ = plan_demand(group, observed, memory)
    assert isinstance(second, Plan)
    assert second.grows == ("b",)  # short two rounds in a row, its queue at QUEUE on average: free budget


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.floats(0.3, 1.0))
def test_a_budget_cut_is_met_by_shrinks_alone(case: tuple[GroupPolicy, Rounds], cut: float) -> None:
    """The budget lowered under the limits (a spec change): the next plan fits it, and grows nothing."""
    group, rounds = case
    limits = starting_limits(group)
    floor = sum(m.min_bytes for m in group.models)
    smaller = replace(group, budget_bytes=max(floor, int(group.budget_bytes * cut)))
    assume(sum(limits.values()) > smaller.budget_bytes)
    observed = {n: replace(o, reachable=True) for n, o in observe(limits, rounds[0]).items()}
    result, _ = plan_demand(smaller, observed, Memory())
    assert isinstance(result, Plan)
    assert sum(result.limits.values()) <= smaller.budget_bytes
    assert result.grows == ()
    assert all(m.min_bytes <= result.limits[m.name] <= m.max_bytes for m in group.models)


def test_a_minimum_between_two_pages_is_met_at_the_lower_and_not_granted_again() -> None:
    """The pool rounds a limit down to whole pages: 12 MiB / 9 became 1.25 MiB with 256 KiB pages,
    and granting the last 80 KiB every round moved nothing (the benchmark saw it each second)."""
    page = 256 << 10
    lo = 12 * MiB // 9
    group = GroupPolicy(12 * MiB, (ModelBudget("a", lo, 11 * MiB), ModelBudget("b", lo, 11 * MiB)),
                        hysteresis_bytes=MiB // 2, max_step_bytes=6 * MiB)  # fmt: skip
    floored = lo // page * page
    memory = Memory()
    for _ in range(4):
        observed = {"a": Observation(10 * MiB, 4 * MiB, running_requests=4, page_bytes=page),
                    "b": Observation(floored, 0, page_bytes=page)}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        assert (result.grows, result.shrinks) == ((), ())
    below = {"a": Observation(10 * MiB, 4 * MiB, running_requests=4, page_bytes=page),
             "b": Observation(floored - page, 0, page_bytes=page)}  # fmt: skip
    result, _ = plan_demand(group, below, memory)
    assert isinstance(result, Plan)
    assert result.grows == ("b",)  # a page short is short


def test_a_small_model_whose_queue_matches_what_runs_is_short() -> None:
    """One request runs, one or two wait: the model's waits double, though its queue never
    reaches ``QUEUE`` (the longtail benchmark's smallest model waited 14 s at 1.8 MiB this way)."""
    group = two_models()
    limits = {"a": 56 * MiB, "b": 8 * MiB}
    memory, grown = Memory(), []
    for waiting in (1, 2, 1, 2):
        observed = {"a": Observation(limits["a"], 20 * MiB, running_requests=10),
                    "b": Observation(limits["b"], 8 * MiB, waiting, running_requests=1)}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        grown.append(result.grows)
        limits = result.limits
    assert ("b",) in grown[: PERSIST + 1]


def hand_over(finishing_after: int) -> dict[str, int]:
    """a grew in a burst (finishing 12 requests a round) to 56 MiB, c at its minimum; then a's
    pool stands 90% empty while it finishes ``finishing_after`` a round, and b queues at its fair
    share. a's limit after three such rounds."""
    group = three_models(dwell=8)
    limits, memory, done = {"a": 40 * MiB, "b": 32 * MiB, "c": 24 * MiB}, Memory(), 0
    for r in range(7):
        busy = r < 4
        done += 12 if busy else finishing_after
        used_a = min(limits["a"], 52 * MiB) if busy else 4 * MiB
        observed = {"a": Observation(limits["a"], used_a, 20 if busy else 0, running_requests=12 if busy else 2,
                                     finished_total=done),
                    "b": Observation(limits["b"], 28 * MiB if busy else limits["b"], 0 if busy else 20,
                                     running_requests=12, finished_total=3 * r),
                    "c": Observation(limits["c"], 0, finished_total=0)}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        limits = result.limits
    return limits


def test_a_pool_standing_empty_keeps_its_grant_while_its_requests_still_finish_at_their_rate() -> None:
    """A steady load of short requests stands mostly empty between arrivals; its finishing rate
    says the load is still there (its memory given away cost it 3x at p99)."""
    grown = hand_over(finishing_after=12)["a"]
    assert grown == 56 * MiB  # what it took from c, held
    assert hand_over(finishing_after=1)["a"] < grown  # the rate fell twelvefold: the load left


def test_a_burst_takes_what_a_pool_is_not_holding_once_its_finishing_rate_halved() -> None:
    """The tail of a's burst finishes half its peak rate with nothing waiting: b's burst at its
    share takes what a does not hold (it waited at its share 3 s for a's rate to fall fourfold),
    and a keeps room for what it holds."""
    slackened = hand_over(finishing_after=6)["a"]
    assert int(4 * MiB * 1.1) <= slackened < hand_over(finishing_after=12)["a"]


def light_load_lends(running: int) -> int:
    """b, a light load at its fair share, finishes 1-2 a round, then none for three rounds with
    ``running`` requests in its pool (6 of its 32 MiB used, nothing waiting); a is short with a
    burst's queue (``SURGE``) from the fourth round on, fewer than ``LOAN`` rounds, so b would lend
    to it only with its load gone (``quiet``) or slackened (``slack``): both read ``looks_idle``. b's
    limit after them."""
    group = two_models(dwell=8)
    limits, memory, finished = {"a": 32 * MiB, "b": 32 * MiB}, Memory(), 0
    for r, done in enumerate([2, 1, 2, 0, 0, 0]):
        finished += done
        short = r >= 3
        observed = {"a": Observation(limits["a"], limits["a"] if short else 8 * MiB, 10 if short else 0,
                                     running_requests=16, finished_total=8 * r),
                    "b": Observation(limits["b"], 6 * MiB, running_requests=running,
                                     finished_total=finished)}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        limits = result.limits
    return limits["b"]


def test_a_light_load_with_requests_running_is_not_idle_for_rounds_that_finished_none() -> None:
    """A load that finishes a request or two a round has rounds that finish none; with requests
    running that is no sign its load left (longtail's smallest model, lent so with two requests
    running, made its next four wait 2 s). With nothing running, the same pool is idle and lends."""
    assert light_load_lends(running=2) == 32 * MiB
    assert light_load_lends(running=0) < 32 * MiB

"""Loans home (``kvpool_operator.demand_home``): at rest, a loan its holder no longer uses goes back
toward the static split."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kvpool_operator.demand import fair_shares, plan_demand
from kvpool_operator.demand_home import HOME_WAIT, home_move, spare_loan
from kvpool_operator.demand_memory import Memory, ModelMemory
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation, Plan

from tests.operator.demand_rounds import MiB, run, two_models

PAGE = MiB // 4
REQUEST = 9 * MiB // 8  #: the colocation benchmark's request: 1.125 MiB


def longtail_group() -> GroupPolicy:
    """The colocation benchmark's longtail group: 8 MiB among three models (shares of 2.67 MiB)."""
    return GroupPolicy(8 * MiB, tuple(ModelBudget(n, 3 * MiB // 4, 13 * MiB // 2) for n in "abc"),
                       hysteresis_bytes=MiB // 4, max_step_bytes=4 * MiB, dwell_rounds=8)  # fmt: skip


def at_rest(slack_rounds: int) -> tuple[Memory, dict[str, Observation]]:
    """a holds 4.25 MiB (a loan of 1.58) and ran nothing this round, after ``slack_rounds`` slack
    ones; b, lent down to 1 MiB, is idle; c runs one request in its share. No one wants memory."""
    memory = Memory(20, {n: ModelMemory(per_request=REQUEST, largest_request=REQUEST, finished_seen=30,
                                        slack_rounds=slack_rounds * (n == "a")) for n in "abc"})  # fmt: skip
    observed = {"a": Observation(17 * MiB // 4, 0, page_bytes=PAGE, finished_total=31),
                "b": Observation(MiB, 0, page_bytes=PAGE, finished_total=30),
                "c": Observation(11 * MiB // 4, MiB, running_requests=1, page_bytes=PAGE,
                                 finished_total=30)}  # fmt: skip
    return memory, observed


def test_a_loan_whose_holder_ran_nothing_two_rounds_goes_to_the_model_furthest_below_its_share() -> None:
    """a keeps its share's page (2.75 MiB) and gives the rest of its loan, 1.5 MiB in whole
    pages, to b: b's ramp then starts two requests at once where it queued for a claim's round
    trip (stop 49, longtail seed 0, 17.5 s)."""
    memory, observed = at_rest(slack_rounds=1)
    result, memory = plan_demand(longtail_group(), observed, memory)
    assert isinstance(result, Plan)
    assert result.limits == {"a": 11 * MiB // 4, "b": 5 * MiB // 2, "c": 11 * MiB // 4}
    assert (result.shrinks, result.grows) == (("a",), ("b",))
    a, b = memory.models["a"], memory.models["b"]
    assert (a.last_home, a.last_shrink, b.last_grow) == (21, -(10**9), -(10**9))  # no dwell stamped


def test_a_loan_stays_through_a_single_slack_round() -> None:
    """One round running nothing is a Poisson gap: alternating bursts' busy model had one two
    seconds before its phase ended, and ran five requests the next round."""
    memory, observed = at_rest(slack_rounds=0)
    result, _ = plan_demand(longtail_group(), observed, memory)
    assert isinstance(result, Plan)
    assert result.limits == {n: o.limit_bytes for n, o in observed.items()}


def test_a_loan_with_a_request_waiting_or_preempted_is_in_use() -> None:
    mem = ModelMemory(slack_rounds=2, quiet_rounds=2)
    fair = 8 * MiB // 3
    assert spare_loan(17 * MiB // 4, fair, Observation(17 * MiB // 4, 0), mem, REQUEST) > 0
    assert spare_loan(17 * MiB // 4, fair, Observation(17 * MiB // 4, 0, waiting_requests=1), mem, REQUEST) == 0
    assert spare_loan(17 * MiB // 4, fair, Observation(17 * MiB // 4, 0, preemptions=1), mem, REQUEST) == 0


def test_a_holder_keeps_room_for_one_request_more_than_it_holds() -> None:
    """Running one 1.125-MiB request in 4.25 MiB, a keeps its 2.67-MiB share (room for a request
    more lies within it); holding 2 MiB it keeps 3.125."""
    mem, fair, limit = ModelMemory(slack_rounds=2), 8 * MiB // 3, 17 * MiB // 4
    assert spare_loan(limit, fair, Observation(limit, REQUEST, running_requests=1), mem, REQUEST) == limit - fair
    held = Observation(limit, 2 * MiB, running_requests=2)
    assert spare_loan(limit, fair, held, mem, REQUEST) == limit - 2 * MiB - REQUEST
    assert spare_loan(fair, fair, Observation(fair, 0), mem, REQUEST) == 0  # at its share: no loan


def test_less_than_a_request_is_not_sent_home_unless_it_is_all_the_recipient_lacks() -> None:
    """a's spare loan is 0.5 MiB (it holds 1.625 of 3.25 and keeps room for a request): a resize for
    less than one of b's requests, 1.75 MiB short of its share's page, is left alone; b 0.42 MiB
    below its share (0.5 to its page) takes it."""
    group = longtail_group()
    mems = {n: ModelMemory(per_request=REQUEST, largest_request=REQUEST, slack_rounds=2 * (n == "a")) for n in "abc"}
    a = Observation(13 * MiB // 4, 13 * MiB // 8, running_requests=1, page_bytes=PAGE)
    fair = fair_shares(list(group.models), group.budget_bytes)
    for b_limit, move in ((MiB, None), (9 * MiB // 4, ("a", "b", MiB // 2))):
        observed = {"a": a, "b": Observation(b_limit, 0, page_bytes=PAGE),
                    "c": Observation(8 * MiB - a.limit_bytes - b_limit, 0, page_bytes=PAGE)}  # fmt: skip
        assert home_move(group, group.models, observed, fair, mems, REQUEST, 0, 20) == move


def test_a_loan_goes_home_at_most_max_step_at_a_time_and_not_while_budget_lies_free() -> None:
    memory, observed = at_rest(slack_rounds=1)
    group = replace(longtail_group(), max_step_bytes=5 * MiB // 4)
    result, _ = plan_demand(group, observed, memory)
    assert isinstance(result, Plan)
    assert (result.limits["a"], result.limits["b"]) == (3 * MiB, 9 * MiB // 4)
    observed["a"] = replace(observed["a"], limit_bytes=4 * MiB)  # a page of the budget free
    result, memory = plan_demand(longtail_group(), observed, memory)
    assert isinstance(result, Plan)
    assert result.limits == {n: o.limit_bytes for n, o in observed.items()}  # the next to want memory takes it
    assert memory.models["a"].last_home < 0


@pytest.mark.parametrize("dwell", [3, 8])
def test_a_load_that_comes_and_goes_beside_an_idle_model_sends_its_loan_home_once_in_eight_rounds(
    dwell: int,
) -> None:
    """a runs five requests for four rounds and none for two, b idle at 1 MiB: each time a ebbs its
    loan could go home to b and come back when a's load does -- a flap ``HOME_WAIT`` bounds, at
    the spec's default dwell (3 rounds) too."""
    group = replace(longtail_group(), dwell_rounds=dwell)
    limits = {"a": 17 * MiB // 4, "b": MiB, "c": 11 * MiB // 4}
    memory, moves, finished = Memory(), 0, dict.fromkeys("abc", 0)
    for k in range(36):
        load = {"a": 5 if k % 6 < 4 else 0, "b": 0, "c": 1}
        observed = {}
        for n, want in load.items():
            running = min(want, limits[n] // REQUEST)
            finished[n] += running
            observed[n] = Observation(limits[n], running * REQUEST, want - running, running_requests=running,
                                      page_bytes=PAGE, finished_total=finished[n])  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        moves += bool(result.grows)
        limits = result.limits
    assert moves <= 2 * 36 // HOME_WAIT  # each home move and the grant back, once in eight rounds at most


def test_a_steady_load_keeps_its_loan() -> None:
    """a holds a loan (40 of its 32-MiB share) and uses 20 MiB of it, steadily, finishing ten
    requests a round: its load never ebbs, so nothing goes home to b, idle-ish below its share."""
    group = two_models(dwell=3)
    limits, _, moves = run(group, {"a": 10, "b": 2}, 30, {"a": 40 * MiB, "b": 24 * MiB})
    assert (limits, moves) == ({"a": 40 * MiB, "b": 24 * MiB}, 0)

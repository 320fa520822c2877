"""The demand policy's loans: a grant above a fair share is lent, claimed back by a model short
below its share within any dwell, lent below a share only to a lasting shortage or by a model
whose load left, and moved in whole pages."""

from __future__ import annotations

from dataclasses import replace

from kvpool_operator.demand import LOAN, plan_demand
from kvpool_operator.demand_memory import Memory, ModelMemory
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation, Plan

from tests.operator.demand_rounds import MiB, run, small_pair, three_models, two_models


def test_a_model_below_its_fair_share_reclaims_it_within_the_donors_dwell() -> None:
    """A grant above a fair share is a loan: a burst's queue below its share takes it back in the
    next round, down to the lender's share and no lower while the lender still uses it."""
    group = two_models(dwell=8)
    limits, memory, _ = run(group, {"a": 26, "b": 0}, 3, {"a": 32 * MiB, "b": 32 * MiB})
    assert limits["b"] < 32 * MiB
    busy = limits["a"] // (2 * MiB) * 3 // 4
    after, memory, _ = run(group, {"a": busy, "b": 26}, 1, limits, memory)
    assert after["b"] > limits["b"]  # in its first round short, within a's dwell
    settled, _, _ = run(group, {"a": busy, "b": 26}, 3, after, memory)
    assert settled["a"] == 32 * MiB == settled["b"]


def test_a_model_whose_load_is_still_there_lends_below_its_share_only_to_a_lasting_shortage() -> None:
    """a serves a steady load in a quarter of its share; b is short at its own. Lent after two
    short rounds, the loan came back at a's next spike (the steady benchmark's flap): a lends
    only once b has been short for ``LOAN`` rounds."""
    group = two_models(dwell=2)
    limits, memory, seen = {"a": 32 * MiB, "b": 32 * MiB}, Memory(), []
    for _ in range(LOAN + 1):
        limits, memory, _ = run(group, {"a": 4, "b": 30}, 1, limits, memory)
        seen.append(limits["b"])
    assert seen[: LOAN - 1] == [32 * MiB] * (LOAN - 1)
    assert seen[-1] > 32 * MiB


def test_moves_are_whole_pages_of_both_pools() -> None:
    """A pool rounds its limit down to pages: a move of part of a page left bytes that the next
    round granted from free budget, a second resize for nothing."""
    page = 256 << 10
    group = GroupPolicy(12 * MiB, (ModelBudget("a", 2 * MiB, 10 * MiB), ModelBudget("b", 2 * MiB, 10 * MiB)),
                        hysteresis_bytes=MiB // 2, max_step_bytes=6 * MiB, dwell_rounds=8)  # fmt: skip
    limits, memory, moved = {"a": 10 * MiB, "b": 2 * MiB}, Memory(), []
    for r in range(6):
        observed = {"a": Observation(limits["a"], MiB, running_requests=1, page_bytes=page, finished_total=r),
                    "b": Observation(limits["b"], limits["b"], 5, running_requests=2, page_bytes=page,
                                     finished_total=2 * r)}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        moved += [result.limits[n] - limits[n] for n in result.grows]
        limits = result.limits
    assert moved
    assert all(b % page == 0 for b in moved)
    assert all(v % page == 0 for v in limits.values())


def test_a_cold_model_below_its_share_takes_back_what_its_queue_needs_not_a_busy_models_loan() -> None:
    """b, idle below its share, queues three requests for two rounds: it takes back room for them,
    not its whole share from a, whose pool is full of its burst."""
    group = two_models(dwell=8)
    limits, memory, _ = run(group, {"a": 26, "b": 0}, 3, {"a": 32 * MiB, "b": 32 * MiB})
    lent = limits["a"] - 32 * MiB
    assert lent > 8 * MiB
    after, _, _ = run(group, {"a": 40, "b": limits["b"] // (2 * MiB) + 3}, 3, limits, memory)
    assert after["b"] > limits["b"]  # its queue got room
    assert after["a"] - 32 * MiB > lent // 2  # a kept most of its loan


def test_a_burst_takes_what_a_pool_its_load_just_left_is_not_holding_after_one_idle_round() -> None:
    """Alternating bursts: b's burst gets a's memory above what a holds once a's load looked
    gone for one round, not after ``QUIET`` rounds (each phase spent a second more at the old
    split waiting for a second idle round); with no load left anywhere, nothing moves."""
    group = replace(two_models(dwell=8), max_step_bytes=64 * MiB)
    limits, memory, _ = run(group, {"a": 26, "b": 0}, 3, {"a": 32 * MiB, "b": 32 * MiB})
    first, _, _ = run(group, {"a": 1, "b": 26}, 1, limits, memory)
    assert memory.models["a"].quiet_rounds == 0
    assert first["b"] > 32 * MiB  # beyond its share in the round a's load left
    assert first["a"] >= int(2 * MiB * 1.1)  # room for a's one request stays
    calm, _, _ = run(group, {"a": 1, "b": 2}, 1, limits, memory)
    assert calm == limits


def after_a_burst(rate: int, a_running: int, a_preempted: int = 0) -> dict[str, int]:
    """a's burst (26 requests of 2 MiB, finishing ``rate`` a round) grew it to 56 MiB; then, in the
    round b's burst of 20 arrives at b's 8 MiB, a finishes ``rate`` more and runs ``a_running``,
    nothing waiting, having preempted ``a_preempted`` in that round. The limits after that round."""
    group = replace(two_models(dwell=8), max_step_bytes=64 * MiB)
    limits, memory, done = {"a": 32 * MiB, "b": 32 * MiB}, Memory(), 0
    for burst in (True, True, True, False):
        done += rate
        running = min(26, limits["a"] // (2 * MiB)) if burst else a_running
        observed = {"a": Observation(limits["a"], 2 * MiB * running, 26 - running if burst else 0,
                                     0 if burst else a_preempted, running_requests=running, finished_total=done),
                    "b": Observation(limits["b"], 0 if burst else limits["b"], 0 if burst else 20,
                                     running_requests=0 if burst else limits["b"] // (2 * MiB))}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        limits = result.limits
    return limits


def test_a_burst_takes_what_a_pool_whose_use_fell_is_not_holding_in_the_round_its_load_ended() -> None:
    """In the round b's burst arrives, a's rate has not fallen yet (it finished its burst's tail),
    but its pool runs nothing -- or, with too few finishing a round to read a fall, one straggler
    of its 26. b gets beyond its share in that round (it got its share, the rest three rounds
    later); a keeps room for a request. Where the rate can be read it decides (a steady load of
    short requests holds little at any moment), and a pool at a third of its peak use holds on."""
    for rate, running in ((26, 0), (6, 0), (6, 1)):
        after = after_a_burst(rate, running)
        assert after["b"] > 32 * MiB, (rate, running)
        assert after["a"] >= (running + 1) * 2 * MiB
    assert after_a_burst(26, 1)["b"] == 32 * MiB
    assert after_a_burst(6, 9)["b"] == 32 * MiB


def test_a_pool_that_preempted_as_its_burst_ended_and_runs_nothing_gives_to_the_next_burst() -> None:
    """a preempted two of its burst's requests in the round its load ended; nothing of it waits or
    runs now, so they finished: its load is gone, as in a round without preemptions. Read as
    still short of memory, it held the next burst at its share for a round (alternating bursts,
    stop 44, seed 0, 38 s: b's worst requests). A preemption beside a request still running is
    a load still there: a holds on."""
    assert after_a_burst(26, 0, a_preempted=2)["b"] > 32 * MiB
    assert after_a_burst(6, 1, a_preempted=2)["b"] == 32 * MiB


def test_a_short_model_held_by_its_dwell_does_not_hold_back_another_short_model() -> None:
    """a is furthest below its target but shrank two rounds ago (above its share, no claim);
    b is short too and settled: b is served from c's idle memory, not made to wait a's dwell."""
    group = three_models(dwell=8)
    memory = Memory(5, {"a": ModelMemory(last_shrink=4, short_rounds=5, waiting_ewma=10, deep=True),
                        "b": ModelMemory(short_rounds=5, waiting_ewma=10, deep=True)})  # fmt: skip
    observed = {"a": Observation(34 * MiB, 34 * MiB, 10, running_requests=17),
                "b": Observation(40 * MiB, 40 * MiB, 10, running_requests=20),
                "c": Observation(22 * MiB, 8 * MiB, running_requests=4)}  # fmt: skip
    result, _ = plan_demand(group, observed, memory)
    assert isinstance(result, Plan)
    assert (result.grows, result.shrinks) == (("b",), ("c",))


def test_a_burst_at_its_share_takes_an_idle_pools_memory_though_their_needs_just_fill_the_budget() -> None:
    """a bursts at its 8-MiB share (six waiting) beside b, which runs nothing: a's need stops at
    its maximum and b's at its minimum, so together they fill the budget exactly -- and the round
    counted as uncontested, where a burst takes nothing from a pool at its share. a now takes
    what b does not hold in that round (stop 42's bursts: a waited one round more, and eight of
    a's requests queued for three rounds beside an idle b still in the dwell of its grant)."""
    group = GroupPolicy(16 * MiB, (ModelBudget("a", 2 * MiB, 14 * MiB), ModelBudget("b", 2 * MiB, 14 * MiB)),
                        hysteresis_bytes=MiB // 2, max_step_bytes=8 * MiB, dwell_rounds=8)  # fmt: skip
    observed = {"a": Observation(8 * MiB, 8 * MiB, 6, running_requests=4, finished_total=4),
                "b": Observation(8 * MiB, 0, finished_total=1)}  # fmt: skip
    result, memory = plan_demand(group, observed, Memory())
    assert isinstance(result, Plan)
    assert memory.models["a"].surge
    assert memory.models["b"].slack
    assert result.limits == {"a": 14 * MiB, "b": 2 * MiB}


def test_a_pool_running_nothing_is_an_idle_loan_whatever_the_shares() -> None:
    """Shares 32/16/16 (weights 2:1:1): a lacks 24 MiB of its share; b holds a 4-MiB loan and runs
    nothing. a's first short round with a queue of two takes memory at once, though b's pool
    (20 MiB) is smaller than what a lacks: a pool running nothing stands idle whatever its size."""
    group = GroupPolicy(64 * MiB, (ModelBudget("a", 4 * MiB, 64 * MiB, weight=2.0),
                                   ModelBudget("b", 4 * MiB, 64 * MiB), ModelBudget("c", 4 * MiB, 64 * MiB)),
                        hysteresis_bytes=2 * MiB, max_step_bytes=64 * MiB, dwell_rounds=8)  # fmt: skip
    limits = {"a": 8 * MiB, "b": 20 * MiB, "c": 36 * MiB}
    after, _, _ = run(group, {"a": 4 + 2, "b": 0, "c": 18}, 1, limits)
    assert after["a"] > limits["a"]


def test_an_idle_models_memory_goes_first_to_a_model_short_below_its_share() -> None:
    """a's load left; b, above its share, and c, below half its share, both queue. c gets its
    share in the first round (as much of it as one step moves), before b grows: a's memory went to
    b for three rounds while c waited at 16 MiB (longtail's smallest model waited 3 s so)."""
    group = three_models(dwell=8)
    limits, memory, _ = run(group, {"a": 36, "b": 18, "c": 0}, 6, {"a": 32 * MiB, "b": 32 * MiB, "c": 32 * MiB})
    assert limits["c"] < 16 * MiB
    assert limits["b"] >= 32 * MiB
    first, _, _ = run(group, {"a": 0, "b": 30, "c": limits["c"] // (2 * MiB) + 3}, 1, limits, memory)
    assert first["c"] == min(32 * MiB, limits["c"] + group.max_step_bytes)
    assert first["b"] == limits["b"]


def test_a_model_lent_below_its_share_keeps_room_for_one_request_more_than_it_uses() -> None:
    """c served three requests, then none: its idle memory goes to a's queue down to one request
    (its minimum holds one). c running one request, with a short for LOAN rounds, lends down to
    two -- not to its one-request working set (two that came together to longtail's smallest
    model so waited 3.1 s, one for the other, 29x its static p99)."""
    group = GroupPolicy(64 * MiB, (ModelBudget("a", 2 * MiB, 64 * MiB), ModelBudget("c", 2 * MiB, 64 * MiB)),
                        hysteresis_bytes=2 * MiB, max_step_bytes=16 * MiB, dwell_rounds=2)  # fmt: skip
    limits, memory, _ = run(group, {"a": 30, "c": 3}, 4, {"a": 32 * MiB, "c": 32 * MiB})
    idle, _, _ = run(group, {"a": 40, "c": 0}, 12, limits, memory)
    assert idle == {"a": 62 * MiB, "c": 2 * MiB}  # c: one 2-MiB request, its minimum
    one, _, _ = run(group, {"a": 40, "c": 1}, 12, limits, memory)
    assert 2 * 2 * MiB <= one["c"] < 3 * 2 * MiB  # c lent below its share: room for two 2-MiB requests, not three


def test_a_pool_that_can_start_none_of_its_requests_takes_less_than_a_request() -> None:
    """b, lent down to less than one of its 2-MiB requests, queues three and runs none; a and c
    each hold less than a request above their targets: less than a request, but all b lacks to
    start one. Refused because it is less than a request, longtail's second model (8 MiB, three
    models) ran nothing for 13 s with up to 14 queued."""
    group = GroupPolicy(16 * MiB, tuple(ModelBudget(n, MiB, 13 * MiB) for n in "abc"),
                        hysteresis_bytes=MiB // 2, max_step_bytes=8 * MiB, dwell_rounds=2)  # fmt: skip
    limits = {"a": 15 * MiB // 2, "b": 3 * MiB // 2, "c": 7 * MiB}
    after, _, _ = run(group, {"a": 8, "b": 3, "c": 2}, 3, limits)
    assert after["b"] >= 2 * MiB > limits["b"]


def test_a_model_none_of_whose_requests_ran_lends_all_but_room_for_one() -> None:
    """b has run nothing yet; a's queue takes b's idle memory, but not the room for one request of
    the group's size: lent down to its 1-MiB minimum, longtail's second model could start none of
    its requests when its ramp came."""
    group = small_pair(dwell=2)
    lent, _, _ = run(group, {"a": 30, "b": 0}, 8, {"a": 8 * MiB, "b": 8 * MiB})
    assert lent["b"] == 2 * MiB  # one of a's 2-MiB requests
    assert lent["a"] == 14 * MiB


def test_a_lender_keeps_room_for_the_largest_request_read_two_rounds_in_a_row_not_one_rounds_reading() -> None:
    """b ran 2-MiB requests, then one round read 6 MiB used beside one running request (blocks
    no running request holds -- with the CPU tier on, likely held for a copy to it or a load from
    it). Its idle memory then goes to a's queue down to room for one 2-MiB request: kept for one
    round's reading, longtail's idle busiest model held 2.5 MiB while the second queued 19."""
    group = small_pair(dwell=2)
    limits, memory, _ = run(group, {"a": 4, "b": 1}, 3, {"a": 8 * MiB, "b": 8 * MiB})
    assert memory.models["b"].largest_request == 2 * MiB
    limits, memory = _b_reads(group, limits, memory, 6 * MiB)
    lent, memory, _ = run(group, {"a": 30, "b": 0}, 8, limits, memory)
    assert memory.models["b"].largest_request == 2 * MiB
    assert lent == {"a": 14 * MiB, "b": 2 * MiB}


def test_a_request_size_read_two_rounds_in_a_row_counts_and_one_round_apart_does_not() -> None:
    """The lower of two rounds' readings in a row raises the largest request; two such readings
    with a round of nothing running between them do not (they are no pair)."""
    group = small_pair(dwell=2)
    limits, memory, _ = run(group, {"a": 4, "b": 1}, 3, {"a": 8 * MiB, "b": 8 * MiB})
    for used in (6 * MiB, 0, 6 * MiB):
        limits, memory = _b_reads(group, limits, memory, used)
    assert memory.models["b"].largest_request == 2 * MiB
    for used in (0, 3 * MiB, 4 * MiB):
        limits, memory = _b_reads(group, limits, memory, used)
    assert memory.models["b"].largest_request == 3 * MiB


def _b_reads(group: GroupPolicy, limits: dict[str, int], memory: Memory, used: int) -> tuple[dict[str, int], Memory]:
    """One round: a full with four 2-MiB requests, b reading ``used`` bytes beside one running
    request (none where ``used`` is 0)."""
    done = {n: memory.models[n].finished_seen or 0 for n in "ab"}
    observed = {"a": Observation(limits["a"], 8 * MiB, running_requests=4, finished_total=done["a"] + 4),
                "b": Observation(limits["b"], used, running_requests=int(used > 0),
                                 finished_total=done["b"] + 1)}  # fmt: skip
    result, memory = plan_demand(group, observed, memory)
    assert isinstance(result, Plan)
    return result.limits, memory


def test_a_light_load_within_its_share_keeps_its_working_set_from_a_burst_after_one_empty_round() -> None:
    """c runs three 2-MiB requests, finishing three a round -- too few to read a fall in its rate --
    then, in the second round of a's burst, none. One round with nothing running is a gap between
    a light load's requests, not its end: c keeps room for its working set and a request more
    (lent down to one request's room, longtail's smallest model queued its next two requests
    ~3 s for a claim -- its worst). A model whose use went above its share (the burst that just
    ended) still gives a burst what it does not hold (``after_a_burst``)."""
    group = GroupPolicy(48 * MiB, tuple(ModelBudget(n, 2 * MiB, 44 * MiB) for n in "abc"),
                        hysteresis_bytes=MiB, max_step_bytes=16 * MiB, dwell_rounds=8)  # fmt: skip
    limits, memory, _ = run(group, {"a": 4, "b": 7, "c": 3}, 3, {n: 16 * MiB for n in "abc"})
    limits, memory, _ = run(group, {"a": 40, "b": 7, "c": 3}, 1, limits, memory)
    gap, memory, _ = run(group, {"a": 40, "b": 7, "c": 0}, 1, limits, memory)
    assert memory.models["c"].slack
    assert memory.models["a"].surge
    assert gap["c"] >= int(3 * 2 * MiB * 1.1) + 2 * MiB
    assert gap["a"] > limits["a"]  # what c does not need still goes to the burst

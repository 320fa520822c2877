"""The demand policy's claims: a model short below its fair share takes it back -- a ramp or a
burst its whole share at once, a pool stalled on one request room for it, a cold model what its
queue needs -- from a loan within any dwell, and in a contested round down to the lender's share
whatever the lender's target."""

from __future__ import annotations

from dataclasses import replace

from kvpool_operator.demand import fair_shares, need, needs_of, plan_demand, targets
from kvpool_operator.demand_memory import PERSIST, SURGE, Memory, ModelMemory
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation, Plan

from tests.operator.demand_rounds import MiB, run, small_pair, three_models, two_models


def test_a_ramp_below_its_share_takes_the_whole_share_back_not_a_queue_at_a_time() -> None:
    """The long-tail benchmark's smallest model: lent down to one request's room, then its ramp --
    claiming what each round's queue would hold, it reached its share 17 s after the ramp began
    (3x static's p99). Short for ``PERSIST`` rounds and needing twice its limit, b takes its
    whole share back in one move; a queue of three behind two requests is no burst (``SURGE``)."""
    group = GroupPolicy(64 * MiB, (ModelBudget("a", 2 * MiB, 62 * MiB), ModelBudget("b", 2 * MiB, 62 * MiB)),
                        hysteresis_bytes=2 * MiB, max_step_bytes=64 * MiB, dwell_rounds=8)  # fmt: skip
    limits, _, _ = run(group, {"a": 30, "b": 5}, PERSIST, {"a": 60 * MiB, "b": 4 * MiB})
    assert limits == {"a": 32 * MiB, "b": 32 * MiB}


def test_a_model_whose_burst_just_left_claims_its_queue_not_its_share() -> None:
    """b's working set and need still carry the burst it just served; a queue of one behind its
    four requests is no ramp: it claims room for that queue, not its share back from a's burst
    (claimed on its need, b took 3 MiB from the next burst for one round and gave it back)."""
    group = two_models(dwell=8)
    mib = float(MiB)
    memory = Memory(5, {"a": ModelMemory(last_grow=4, per_request=2 * mib, finished_seen=10),
                        "b": ModelMemory(need_ewma=40 * mib, recent_used=(40 * mib,) * 4 + (8 * mib,),
                                         per_request=2 * mib, short_rounds=PERSIST, waiting_ewma=3, deep=True,
                                         finished_seen=10)})  # fmt: skip
    observed = {"a": Observation(56 * MiB, 56 * MiB, running_requests=28, finished_total=30),
                "b": Observation(8 * MiB, 8 * MiB, 1, running_requests=4, finished_total=14)}  # fmt: skip
    result, _ = plan_demand(group, observed, memory)
    assert isinstance(result, Plan)
    assert 8 * MiB < result.limits["b"] <= 12 * MiB


def test_a_burst_below_its_share_takes_the_whole_share_back_in_one_round() -> None:
    """A queue of a burst (``SURGE``) behind a full pool below its share: the whole share at once,
    not its queue's bytes a round at a time (alternating bursts spent 3 s below their share that
    way and built queues their phase never drained); a queue of three does not (see above)."""
    group = replace(two_models(dwell=8), max_step_bytes=64 * MiB)
    limits, memory, _ = run(group, {"a": 26, "b": 0}, 3, {"a": 32 * MiB, "b": 32 * MiB})
    assert limits["b"] <= 16 * MiB
    after, _, _ = run(group, {"a": 26, "b": limits["b"] // (2 * MiB) + SURGE}, 1, limits, memory)
    assert after == {"a": 32 * MiB, "b": 32 * MiB}


def test_the_rest_of_a_claimed_share_is_granted_though_less_than_a_request() -> None:
    """b bursts half a request below its share: the last MiB is a claim, not a fix-up (a burst at
    3.5 of its 4 MiB share waited three rounds with six requests queued for it)."""
    group = two_models(dwell=8)
    limits, _, _ = run(group, {"a": 16, "b": 15 + SURGE}, 1, {"a": 33 * MiB, "b": 31 * MiB})
    assert limits == {"a": 32 * MiB, "b": 32 * MiB}


def test_a_short_model_takes_its_share_at_once_from_a_pool_holding_no_request() -> None:
    """b queues two requests (fewer than a burst's ``SURGE``) in its first short round, while a
    holds a loan and runs nothing: b takes its whole share back in that round. While a still
    runs its load, one short round with a short queue moves nothing."""
    group = replace(two_models(dwell=8), max_step_bytes=64 * MiB)
    limits, memory, _ = run(group, {"a": 26, "b": 0}, 3, {"a": 32 * MiB, "b": 32 * MiB})
    assert limits["b"] < 32 * MiB
    queue = {"b": limits["b"] // (2 * MiB) + 2}
    beside_empty, _, _ = run(group, {"a": 0, **queue}, 1, limits, memory)
    assert beside_empty["b"] >= 32 * MiB
    beside_busy, _, _ = run(group, {"a": 26, **queue}, 1, limits, memory)
    assert beside_busy == limits


def test_a_short_model_takes_its_share_at_once_beside_a_loan_that_stands_idle() -> None:
    """c's idle memory went to b's queue; now b runs five requests (10 MiB of its loan) with none
    waiting, and c's first short round with a queue of two takes c's whole share back, within
    b's dwell (longtail's smallest model waited 2.5 s at half its share beside such a pool). A
    loan in use -- b's pool one request from full -- gives nothing to one short round."""
    group = replace(three_models(dwell=8), max_step_bytes=64 * MiB)
    limits, memory, _ = run(group, {"a": 16, "b": 30, "c": 0}, 6, {"a": 32 * MiB, "b": 32 * MiB, "c": 32 * MiB})
    assert limits["c"] < 32 * MiB < limits["b"]
    queue = {"a": 16, "c": limits["c"] // (2 * MiB) + 2}
    idle, _, _ = run(group, {**queue, "b": 5}, 1, limits, memory)
    assert idle == {"a": 32 * MiB, "b": 32 * MiB, "c": 32 * MiB}
    in_use, _, _ = run(group, {**queue, "b": limits["b"] // (2 * MiB) - 1}, 1, limits, memory)
    assert in_use == limits


def test_a_settled_pool_too_small_for_its_one_waiting_request_takes_its_share_at_once() -> None:
    """b, below one 2-MiB request, gets one and cannot start it: its wait is all loss, so it is
    short at once, as a burst is (a queue of one never reached the depth of a shortage: longtail's
    smallest model waited 3 s at 1 MiB for one request). Past its dwell, and a past the dwell of
    its grant, it gets its whole share from a's loan (inside a dwell it claims room for the
    request alone: below)."""
    group = small_pair(dwell=8)
    claimed, _, _ = run(group, {"a": 10, "b": 1}, 1, {"a": 29 * MiB // 2, "b": 3 * MiB // 2})
    assert claimed == {"a": 8 * MiB, "b": 8 * MiB}


def test_a_pool_whose_one_request_waits_with_none_running_claims_its_share_in_the_second_round() -> None:
    """c, lent down to 8 MiB, ran 2-MiB requests; now one request waits and none runs although
    the room would hold one of those (this one is longer). A queue of one never grows deep (its
    EWMA only nears 1) and the room looks big enough: c waited for rounds (longtail's smallest
    model, 6 s at 1.25 MiB). Stalled ``PERSIST`` rounds, it claims its share back: what a holds
    above its target comes at once."""
    group = three_models(dwell=8)
    limits = {"a": 56 * MiB, "b": 32 * MiB, "c": 8 * MiB}
    memory = Memory(10, {"c": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB, finished_seen=5)})
    seen = []
    for r in range(PERSIST):
        observed = {"a": Observation(limits["a"], limits["a"], running_requests=28, finished_total=28 * r),
                    "b": Observation(limits["b"], 16 * MiB, running_requests=8, finished_total=8 * r),
                    "c": Observation(limits["c"], 0, 1, finished_total=5)}  # fmt: skip
        result, memory = plan_demand(group, observed, memory)
        assert isinstance(result, Plan)
        limits = result.limits
        seen.append(limits["c"])
    assert seen[0] == 8 * MiB
    assert seen[1] >= 8 * MiB + 4 * MiB  # room for two of its requests more, from a's loan


def test_a_pool_stalled_on_one_request_within_its_dwell_claims_room_for_it_then_its_share() -> None:
    """b, lent down to 1.5 MiB inside its dwell, cannot start its one waiting 2-MiB request beside
    a's queue of ten: it claims room for that request in whole pages (2.2 MiB with headroom: 2.25),
    not its share -- claiming its share, longtail's third model took 1.5 MiB from a model with 8
    waiting for one request (stop 48, seed 0). Still stalled with that room (the request is
    longer than any read), it claims its share."""
    group, page = small_pair(dwell=8), MiB // 4
    memory = Memory(10, {"a": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB, last_grow=9, finished_seen=50),
                         "b": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB, last_shrink=9,
                                          finished_seen=5)})  # fmt: skip
    limits, seen = {"a": 29 * MiB // 2, "b": 3 * MiB // 2}, []
    for r in range(2):
        a = Observation(limits["a"], 14 * MiB, 10, running_requests=7, page_bytes=page, finished_total=57 + 7 * r)
        b = Observation(limits["b"], 0, 1, page_bytes=page, finished_total=5)
        result, memory = plan_demand(group, {"a": a, "b": b}, memory)
        assert isinstance(result, Plan)
        limits = result.limits
        seen.append(limits["b"])
    assert seen == [9 * page, 8 * MiB]
    assert limits["a"] == 8 * MiB


def test_a_stalls_claim_under_the_hysteresis_is_granted_from_free_budget() -> None:
    """b, inside its dwell, stalls on one 2-MiB request at 1.5 MiB beside 8.5 MiB of free budget: its
    claim, 0.75 MiB, is under the 2-MiB hysteresis and still granted -- the claim is what it needs
    to start a request, not a fix-up."""
    group = GroupPolicy(20 * MiB, (ModelBudget("a", MiB, 19 * MiB), ModelBudget("b", MiB, 19 * MiB)),
                        hysteresis_bytes=2 * MiB, max_step_bytes=8 * MiB, dwell_rounds=8)  # fmt: skip
    memory = Memory(10, {"a": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB, finished_seen=50),
                         "b": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB, last_shrink=9,
                                          finished_seen=5)})  # fmt: skip
    observed = {"a": Observation(10 * MiB, 10 * MiB, running_requests=5, page_bytes=MiB // 4, finished_total=55),
                "b": Observation(3 * MiB // 2, 0, 1, page_bytes=MiB // 4, finished_total=5)}  # fmt: skip
    result, memory = plan_demand(group, observed, memory)
    assert isinstance(result, Plan)
    assert memory.models["b"].stall
    assert result.limits == {"a": 10 * MiB, "b": 9 * MiB // 4}


def test_a_cold_model_with_one_waiting_and_one_preempted_claims_room_for_its_queue_not_its_share() -> None:
    """b, lent down to one request's room beside a's burst, runs one request with one waiting,
    then preempts it: a preempted request is back in the queue, not one more. Counted twice, it
    read as a ramp and took its whole share from a at its peak for three rounds (bursts+tier,
    stop 42, 18 s); it claims room for the one that waits -- counting the preempted one too, it
    claimed room for two (4.5 MiB)."""
    group = small_pair(dwell=8)
    per = 1.5 * MiB
    memory = Memory(10, {"a": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB, last_grow=9, finished_seen=50),
                         "b": ModelMemory(per_request=per, largest_request=per, last_shrink=9,
                                          finished_seen=5)})  # fmt: skip
    limits = {"a": 14 * MiB, "b": 2 * MiB}
    for r, (used, preempted) in enumerate(((3 * MiB // 2, 0), (7 * MiB // 4, 1))):
        a = Observation(limits["a"], limits["a"], 8, 3, running_requests=7, finished_total=57 + 7 * r)
        b = Observation(limits["b"], used, 1, preempted, running_requests=1, finished_total=5)
        result, memory = plan_demand(group, {"a": a, "b": b}, memory)
        assert isinstance(result, Plan)
        limits = result.limits
    assert not memory.models["b"].ramp
    assert 2 * MiB < limits["b"] < 4 * MiB  # room for its queue of one (3.7 MiB), not two (4.5) nor its share (8)


def test_a_burst_below_its_share_takes_a_loan_back_to_the_lenders_share_whatever_its_target() -> None:
    """a holds a 10-MiB loan and needs all of it and more; b's burst arrives at 6 MiB of its 16-MiB
    share; c holds its share with two requests. The budget cannot hold a's and b's needs: b takes
    its share back from a at once, a down to its share -- not only a's excess over its target
    (the need water-filled beside b's), which held longtail's second model at 1-2.25 MiB of its
    2.67-MiB share for 7 s with 4-9 requests queued (stop 44, seed 0). So past a's dwell and
    within it (a grew 4 MiB from free budget two rounds before). Where the budget holds every
    need, a keeps its own."""
    group = GroupPolicy(48 * MiB, tuple(ModelBudget(n, 2 * MiB, 44 * MiB) for n in "abc"),
                        hysteresis_bytes=MiB, max_step_bytes=16 * MiB, dwell_rounds=8)  # fmt: skip
    models = list(group.models)
    for a_from, a_load, b_load in ((26, 20, 15), (22, 20, 15), (26, 12, 7)):
        start = {"a": a_from * MiB, "b": 6 * MiB, "c": 16 * MiB}
        limits, memory, _ = run(group, {"a": a_load, "b": 2, "c": 2}, 3, start)
        within_dwell = memory.round - memory.models["a"].last_grow <= group.dwell_rounds
        assert limits["a"] == 26 * MiB
        assert within_dwell == (a_from == 22)
        after, memory, _ = run(group, {"a": a_load, "b": b_load, "c": 2}, 1, limits, memory)
        needs, wanted, contested = needs_of(models, memory.models, group.budget_bytes, limits)
        assert memory.models["b"].surge
        assert targets(models, needs, wanted, group.budget_bytes)["a"] > 16 * MiB
        assert contested == (b_load == 15)
        if contested:
            assert after["b"] == 16 * MiB == after["a"]
        else:
            assert after["a"] == limits["a"]


def three_of_48(*names: str) -> GroupPolicy:
    """48 MiB between three models of 2-44 MiB: fair shares of 16."""
    return GroupPolicy(48 * MiB, tuple(ModelBudget(n, 2 * MiB, 44 * MiB) for n in names),
                       hysteresis_bytes=MiB, max_step_bytes=16 * MiB, dwell_rounds=8)  # fmt: skip


def test_a_round_contested_only_by_a_bursts_share_is_contested_for_its_claim() -> None:
    """As in the test above, but a runs 13 requests: the needs as read (a 28.6, b 12.1, c 4.4 MiB)
    fit the budget; with b's burst raised to its 16-MiB share they do not, and the water-fill puts
    a's target (27.6) above a's limit. Read as uncontested, the round kept a's loan whole -- a's
    excess over its target is nothing, c holds its share -- and b burst at 6 of its 16 MiB with
    four requests waiting for two rounds: it takes its share back from a at once, down to a's
    share."""
    group = three_of_48("a", "b", "c")
    models = list(group.models)
    limits, memory, _ = run(group, {"a": 13, "b": 2, "c": 2}, 3, {"a": 26 * MiB, "b": 6 * MiB, "c": 16 * MiB})
    assert limits == {"a": 26 * MiB, "b": 6 * MiB, "c": 16 * MiB}
    after, memory, _ = run(group, {"a": 13, "b": 7, "c": 2}, 1, limits, memory)
    needs, wanted, contested = needs_of(models, memory.models, group.budget_bytes, limits)
    assert memory.models["b"].surge
    assert contested
    assert sum(need(m, memory.models[m.name]) for m in models) < group.budget_bytes
    assert targets(models, needs, wanted, group.budget_bytes)["a"] > 26 * MiB
    assert after == {"a": 16 * MiB, "b": 16 * MiB, "c": 16 * MiB}


def test_a_claim_that_two_lenders_could_give_comes_from_the_loan_its_holder_does_not_need() -> None:
    """a and d each hold 4 MiB above their 16-MiB shares; a queues three requests beside it (its
    target 18.6 MiB), d uses 14 MiB of its 20 (its target 15.4). b, short below its share two
    rounds with three waiting, claims 7.4 MiB; a contested round lets either give 4. d gives it:
    picked by room alone (a tie), a was cut to 16 MiB, below its target, beside d's idle loan."""
    group = three_of_48("a", "b", "d")
    models = list(group.models)
    limits, memory, _ = run(group, {"a": 13, "b": 7, "d": 7}, 2, {"a": 20 * MiB, "b": 8 * MiB, "d": 20 * MiB})
    needs, wanted, contested = needs_of(models, memory.models, group.budget_bytes, limits)
    assert contested
    assert not memory.models["b"].surge
    assert targets(models, needs, wanted, group.budget_bytes)["a"] > 16 * MiB
    assert limits == {"a": 20 * MiB, "b": 12 * MiB, "d": 16 * MiB}


def test_a_lender_whose_load_slackened_gives_a_bursts_claim_in_a_round_contested_by_its_share() -> None:
    """As above, a's 13 requests and b's burst at 6 MiB: but a's load fell to 6 requests in the
    round (slack). A slack lender gives a burst down to its target -- here above its limit, as the
    needs as read fit the budget and a's working set still carries its 13 -- and the claim came
    after that, so b got nothing from a slack lender that a busy one gives: now the claim holds."""
    group = three_of_48("a", "b", "c")
    limits, memory, _ = run(group, {"a": 13, "b": 2, "c": 2}, 3, {"a": 26 * MiB, "b": 6 * MiB, "c": 16 * MiB})
    after, memory, _ = run(group, {"a": 6, "b": 7, "c": 2}, 1, limits, memory)
    assert memory.models["a"].slack
    assert memory.models["b"].surge
    assert after == {"a": 16 * MiB, "b": 16 * MiB, "c": 16 * MiB}


def test_a_burst_below_its_share_takes_it_at_once_from_a_model_holding_more_than_it_needs() -> None:
    """Every need fits the budget: a runs 12 requests in a 24-MiB loan (its target above it), d
    runs two in its 16-MiB share, b's burst comes at 8 of its 16 MiB. A static split gives b its
    share; d's memory beyond its target and a request more is not needed. b takes it at once --
    it waited ``LOAN`` rounds, as a lasting shortage does, for memory no one used."""
    group = three_of_48("a", "b", "d")
    models = list(group.models)
    limits, memory, _ = run(group, {"a": 12, "b": 2, "d": 2}, 3, {"a": 24 * MiB, "b": 8 * MiB, "d": 16 * MiB})
    assert limits == {"a": 24 * MiB, "b": 8 * MiB, "d": 16 * MiB}
    after, memory, _ = run(group, {"a": 12, "b": 8, "d": 2}, 1, limits, memory)
    _, _, contested = needs_of(models, memory.models, group.budget_bytes, limits)
    assert memory.models["b"].surge
    assert not contested
    assert after["a"] == 24 * MiB
    assert after["b"] == 16 * MiB
    assert 6 * MiB < after["d"] < 16 * MiB  # its target (4.4 MiB) and one request more (2 MiB)


def test_in_a_contested_round_the_deeper_queue_gets_more_memory_and_the_other_keeps_its_share() -> None:
    """Longtail's second and third models at once (stop 46, seed 0): both queues past what their
    maxima hold, so their needs read alike and an even split held 3.5 MiB each with 30 and 8
    requests waiting for 12 s. Beyond each one's share the rest goes by what its queue would hold:
    b (40 requests) ends above c (12), c keeps its 16-MiB share, and the split holds still."""
    group = three_of_48("a", "b", "c")
    load = {"a": 0, "b": 40, "c": 12}
    limits, memory, _ = run(group, load, 2, {"a": 2 * MiB, "b": 23 * MiB, "c": 23 * MiB})
    assert limits["b"] > limits["c"] + 4 * MiB
    assert limits["c"] >= 16 * MiB
    assert limits["a"] == 2 * MiB
    held, _, moves = run(group, load, 16, limits, memory)
    assert held == limits
    assert moves == 0


def three_in_pages(*loads: int) -> tuple[GroupPolicy, dict[str, int]]:
    """8 MiB among three models, shares of 2.67 MiB between two pages of 0.25 MiB (longtail's)."""
    group = GroupPolicy(8 * MiB, tuple(ModelBudget(n, MiB, 6 * MiB) for n in "abc"),
                        hysteresis_bytes=MiB // 4, max_step_bytes=4 * MiB, dwell_rounds=8)  # fmt: skip
    return group, dict(zip("abc", loads, strict=True))


def test_a_claim_of_a_share_between_two_pages_is_the_upper_page() -> None:
    """Longtail's third model (stop 47, seed 1): c queued seven requests at 2.5 MiB, the page below
    its 2.67-MiB share, beside b's 3 MiB inside b's dwell; its claim of the 0.17 MiB to its share
    was less than a page, and c waited 9 s. Now the claim is the page that holds the share: b
    gives it, keeps its own share, and the split holds still."""
    (group, load), page = three_in_pages(2, 3, 2), MiB // 4
    limits, memory, _ = run(group, load, 1, {"a": 10 * page, "b": 12 * page, "c": 10 * page}, request=MiB, page=page)
    memory = replace(memory, models={**memory.models, "b": replace(memory.models["b"], last_grow=memory.round)})
    limits, memory, _ = run(group, {**load, "c": 9}, PERSIST + 1, limits, memory, request=MiB, page=page)
    fair = fair_shares(list(group.models), group.budget_bytes)
    assert limits["c"] == 11 * page > fair["c"]
    assert limits["b"] == 11 * page > fair["b"]
    assert limits["a"] == 10 * page
    held, _, moves = run(group, {**load, "c": 9}, 12, limits, memory, request=MiB, page=page)
    assert held == limits
    assert moves == 0


def test_a_share_claimed_to_its_page_passes_a_target_at_the_share() -> None:
    """All three queue past the budget, so each target is its share (2.67 MiB) and b's and c's
    deficits, 0.17 MiB, are less than a page: the claim of the page holding the share carries the
    move past the target. a, a page above its share, gives one; then no model is a page above
    its own, and nothing moves -- the third model keeps the page below its share."""
    (group, load), page = three_in_pages(12, 12, 12), MiB // 4
    limits, memory, _ = run(group, load, PERSIST + 1, {"a": 12 * page, "b": 10 * page, "c": 10 * page},
                            request=MiB, page=page)  # fmt: skip
    assert limits["a"] == 11 * page
    assert sorted(limits.values()) == [10 * page, 11 * page, 11 * page]
    held, _, moves = run(group, load, 12, limits, memory, request=MiB, page=page)
    assert held == limits
    assert moves == 0

"""What the demand policy remembers of a model between rounds: here, what a round's preemptions
say once the pool runs and queues nothing, when a stall is of one request, and which pool stands
idle on a loan."""

from __future__ import annotations

from kvpool_operator.demand import plan_demand
from kvpool_operator.demand_memory import SURGE, Memory, ModelMemory, beside_an_idle_loan, remember
from kvpool_operator.policy import ModelBudget, Observation, Plan

from tests.operator.demand_rounds import MiB, small_pair


def test_a_pool_that_preempted_a_bursts_tail_and_holds_nothing_now_is_slack_not_a_burst() -> None:
    """b preempted ``SURGE`` requests in the round, and none of them waits or runs: they finished.
    Read as short, b was a burst (a queue of ``SURGE``) and claimed its share from a's burst for
    requests no longer there. With one of them back in the queue, b is short and a burst."""
    mib = float(MiB)
    prev = ModelMemory(per_request=2 * mib, largest_request=2 * mib, recent_used=(8 * mib,) * 3,
                       finished_seen=30, recent_finished=(6, 6, 6))  # fmt: skip
    gone = Observation(4 * MiB, 0, 0, SURGE, running_requests=0, finished_total=36)
    mem = remember(prev, gone, 2 * mib, 8)
    assert mem.slack
    assert not mem.surge
    assert mem.short_rounds == 0
    back = remember(prev, Observation(4 * MiB, 4 * MiB, 1, SURGE, running_requests=2, finished_total=36), 2 * mib, 8)
    assert back.surge
    assert back.short_rounds == 1
    group = small_pair(dwell=8)
    a = Observation(12 * MiB, 12 * MiB, 6, running_requests=6, finished_total=40)
    result, _ = plan_demand(group, {"a": a, "b": gone}, Memory(10, {"a": ModelMemory(finished_seen=34), "b": prev}))
    assert isinstance(result, Plan)
    assert result.limits["b"] <= 4 * MiB  # no claim of its 8-MiB share from a's burst


def test_a_request_preempted_back_into_an_empty_pools_queue_is_a_stall_of_one_not_two() -> None:
    """b preempted its one request and runs nothing, the request back in its queue: a stall of one
    request (it claims room for it, ``stall_claim``), not a queue of two (its share) -- counted
    twice, a preempted request was a queue it is not (``demand._claim``). Two waiting are no stall
    of one."""
    mib = float(MiB)
    prev = ModelMemory(per_request=2 * mib, largest_request=2 * mib, finished_seen=5, recent_finished=(1,))
    one = remember(prev, Observation(MiB, 0, 1, 1, running_requests=0, finished_total=5), 2 * mib, 8)
    assert one.surge
    assert one.stall
    two = remember(prev, Observation(MiB, 0, 2, 0, running_requests=0, finished_total=5), 2 * mib, 8)
    assert two.surge
    assert not two.stall


def test_a_loan_whose_preempted_requests_finished_stands_idle_for_a_claim() -> None:
    """a holds a loan, runs and queues nothing, and preempted two requests in the round: they
    finished. b, short below its share with two waiting, claims its share at once, as beside any
    idle loan; counted as a load, the preemptions held b a second round."""
    group = small_pair(dwell=8)
    mib = float(MiB)
    memory = Memory(10, {"a": ModelMemory(per_request=2 * mib, largest_request=2 * mib, finished_seen=50),
                         "b": ModelMemory(per_request=2 * mib, largest_request=2 * mib, finished_seen=5)})  # fmt: skip
    a = Observation(12 * MiB, 0, 0, 2, running_requests=0, finished_total=60)
    b = Observation(4 * MiB, 4 * MiB, 2, running_requests=2, finished_total=7)
    result, memory = plan_demand(group, {"a": a, "b": b}, memory)
    assert isinstance(result, Plan)
    assert memory.models["b"].surge
    assert result.limits["b"] == 8 * MiB


def test_a_pool_in_the_page_holding_its_share_is_no_loan_to_claim() -> None:
    """Shares of 2.67 MiB in 0.25-MiB pages: b at 2.75 MiB holds the page with its share, not a
    loan. c, a page below its share and short one round, is no burst beside it however idle b
    stands; beside a pool a whole page above its share (3 MiB), it is (counted a loan, that third
    of a page would go to and fro between two light models, each short a round beside the other)."""
    page, fair = MiB // 4, {n: 8 * MiB // 3 for n in "bc"}
    models = [ModelBudget(n, MiB, 6 * MiB) for n in "bc"]
    c = Observation(10 * page, 10 * page, 1, running_requests=2, page_bytes=page)
    mems = {n: ModelMemory(short_rounds=1) for n in "bc"}
    for b_pages, burst in ((11, False), (12, True)):
        b = Observation(b_pages * page, 0, 0, running_requests=0, page_bytes=page)
        assert beside_an_idle_loan(models, {"b": b, "c": c}, fair, mems)["c"].surge is burst

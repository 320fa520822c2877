"""One rebalancing round through the operator's seam (``AdminAPI``), with a fake client over two
real standalone pools: the shrink first, the grant only from memory the shrink released, a
deferred shrink that never finishes holds the grant back, a server that does not answer keeps
its limit, a server that dies while its shrink drains gets no grant issued against its memory, an
operator killed between shrink and grant restarts into a round that completes within the budget
-- and the pools' own integrity checks pass throughout. The e2e tests run the same
round against real servers through Kubernetes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kvpool_operator.balance import Balancer
from kvpool_operator.demand import LOAN
from kvpool_operator.demand_memory import PERSIST, Memory, ModelMemory
from kvpool_operator.pools import Endpoint, PoolUnreachable
from kvpool_operator.spec import GroupSpec, parse_group
from kvpool_operator.wire import PoolState, ResizeReply

from kvpool import DemandStats, KVPool
from tests.kvpool.factories import MiB, make_config

POD = "10.0.0.1"
EPS = {m: Endpoint(POD, m, 8000 + i) for i, m in enumerate("ab")}


class FakeAdmin:
    """The admin API over in-process pools: snapshots and resizes go through their JSON form."""

    def __init__(self, pools: dict[str, KVPool], demand: dict[str, DemandStats]) -> None:
        self.pools, self.demand = pools, demand
        self.down: set[str] = set()
        self.calls: list[tuple[str, str, int]] = []

    def _pool(self, ep: Endpoint) -> KVPool:
        if ep.model in self.down:
            raise PoolUnreachable(f"{ep.model} at {ep.url}: ConnectError")
        return self.pools[ep.model]

    def snapshot(self, ep: Endpoint) -> PoolState:
        snap = dataclasses.replace(self._pool(ep).snapshot(), demand=self.demand[ep.model])
        return PoolState.from_json(snap.to_dict())

    def set_limit(self, ep: Endpoint, limit_bytes: int, revision: int) -> ResizeReply:
        self.calls.append(("PUT", ep.model, limit_bytes))
        return ResizeReply.from_json(self._pool(ep).resize(limit_bytes, revision).to_dict())

    def close(self) -> None:
        pass


class Clock:
    """Time that passes only when the balancer sleeps; ``on_sleep`` is what the engines do meanwhile."""

    def __init__(self, on_sleep: Callable[[int], None] = lambda _: None) -> None:
        self.t, self.sleeps, self.on_sleep = 1_000_000.0, 0, on_sleep

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.sleeps += 1
        self.on_sleep(self.sleeps)


def _raw() -> dict[str, Any]:
    return {
        "gpuMemoryBudgetBytes": "32Mi",
        "models": [{"name": m, "model": f"/models/{m}", "minBytes": "4Mi", "maxBytes": "28Mi"} for m in "ab"],
        "rebalance": {"hysteresisBytes": "1Mi", "maxStepBytes": "8Mi"},
    }


def group() -> GroupSpec:
    return parse_group(_raw())


@pytest.fixture
def pools() -> Iterator[dict[str, KVPool]]:
    out = {m: KVPool(make_config(limit_bytes=16 * MiB)) for m in "ab"}
    yield out
    for p in out.values():
        p.check_integrity()
        p.close()


def fragment(pool: KVPool) -> list[int]:
    """Fill the pool, then free every other block: half used, but every page still holds one."""
    snap = pool.snapshot()
    blocks = pool.allocate(snap.limit_bytes // snap.block_bytes - 1).blocks  # all but the null block
    pool.free(blocks[::2])
    return blocks[1::2]


BUSY = {"a": DemandStats(4, 8, 0), "b": DemandStats(0, 0, 0)}
#: the policy's memory of earlier rounds in which a was already short: at its fair share, it is
#: lent b's memory once short for LOAN rounds (b's load is not known to have left); b ran requests
#: of 2 MiB, and keeps room for one more (a model none of whose requests ran keeps room for one of
#: the group's largest, a's 4 MiB, and lends too little to start one of a's)
A_WAS_SHORT = Memory(
    1,
    {
        "a": ModelMemory(short_rounds=max(PERSIST, LOAN) - 1, waiting_ewma=8, deep=True),
        "b": ModelMemory(per_request=2 * MiB, largest_request=2 * MiB),
    },
)


def fill(pool: KVPool) -> None:
    """Every block within the limit in use: with requests waiting, the pool is short of memory."""
    snap = pool.snapshot()
    pool.allocate(snap.limit_bytes // snap.block_bytes - 1 - snap.used_blocks)  # the null block is never handed out


def test_the_shrink_is_applied_before_the_grant_and_the_budget_holds(pools: dict[str, KVPool]) -> None:
    fill(pools["a"])
    held = fragment(pools["b"])
    clock = Clock(on_sleep=lambda n: pools["b"].free(held[len(held) // 2 :]) if n == 3 else None)
    admin = FakeAdmin(pools, BUSY)
    r = Balancer(admin, wait_s=5, clock=clock, sleep=clock.sleep).round(group(), POD, EPS, {}, {}, A_WAS_SHORT)
    assert [(z.model, z.status) for z in r.resizes] == [("b", "applied"), ("a", "applied")]
    assert [c[1] for c in admin.calls] == ["b", "a"]  # shrink first
    assert clock.sleeps == 3  # it waited for the deferred shrink, and no longer
    limits = {m: p.snapshot().limit_bytes for m, p in pools.items()}
    assert limits["a"] > 16 * MiB > limits["b"]
    assert sum(limits.values()) <= 32 * MiB
    assert r.balanced


def test_a_shrink_that_stays_deferred_holds_the_grant_back(pools: dict[str, KVPool]) -> None:
    fill(pools["a"])
    fragment(pools["b"])  # its blocks are never freed
    clock = Clock()
    r = Balancer(FakeAdmin(pools, BUSY), wait_s=2, clock=clock, sleep=clock.sleep).round(
        group(), POD, EPS, {}, {}, A_WAS_SHORT
    )
    b = pools["b"].snapshot()
    assert (r.resizes[0].model, r.resizes[0].status) == ("b", "timeout")
    # a may grow only into what b really released: b still holds all its pages
    assert pools["a"].snapshot().limit_bytes + b.physical_bytes <= 32 * MiB
    assert any("grants wait" in p for p in r.problems)
    assert not r.balanced


def test_a_server_that_does_not_answer_keeps_its_limit_and_degrades_the_round(pools: dict[str, KVPool]) -> None:
    fill(pools["a"])
    admin = FakeAdmin(pools, BUSY)
    admin.down.add("b")
    clock = Clock()
    r = Balancer(admin, wait_s=2, clock=clock, sleep=clock.sleep).round(
        group(), POD, EPS, {"b": 16 * MiB}, {}, A_WAS_SHORT
    )
    assert all(z.model != "b" for z in r.resizes)
    assert pools["b"].snapshot().limit_bytes == 16 * MiB
    assert pools["a"].snapshot().limit_bytes <= 32 * MiB - 16 * MiB  # b's known limit stays counted
    assert any("ConnectError" in p for p in r.problems)


def test_revisions_stay_monotonic_across_an_operator_restart_with_a_clock_behind(pools: dict[str, KVPool]) -> None:
    fill(pools["a"])
    admin = FakeAdmin(pools, BUSY)
    first = Balancer(admin, wait_s=2, clock=Clock(), sleep=lambda _: None).round(group(), POD, EPS, {}, {}, A_WAS_SHORT)
    assert first.resizes
    assert all(z.status == "applied" for z in first.resizes)
    seen = pools["a"].snapshot().pending.revision
    behind = Clock()
    behind.t -= 3600  # the restarted operator's node clock runs an hour behind
    fill(pools["a"])  # short again at its new limit
    again = Balancer(admin, wait_s=2, clock=behind, sleep=behind.sleep).round(group(), POD, EPS, {}, {}, A_WAS_SHORT)
    assert all(z.status != "stale" for z in again.resizes)
    assert pools["a"].snapshot().pending.revision >= seen
    assert sum(p.snapshot().limit_bytes for p in pools.values()) <= 32 * MiB


def test_the_policy_is_chosen_by_the_spec_and_its_memory_carries_to_the_next_round(pools: dict[str, KVPool]) -> None:
    fill(pools["a"])
    spec = group()
    proportional = parse_group({**_raw(), "rebalance": {**_raw()["rebalance"], "policy": "proportional"}})
    admin = FakeAdmin(pools, {"a": DemandStats(4, 0, 0), "b": DemandStats(0, 0, 0)})  # full, nothing waits
    demand = Balancer(admin, wait_s=2, clock=Clock(), sleep=lambda _: None).round(spec, POD, EPS, {}, {})
    assert demand.resizes == []  # full but nobody waits: not short of memory, nothing moves
    assert demand.memory.round == 1
    assert demand.memory.models["a"].working_set > 0
    moved = Balancer(admin, wait_s=2, clock=Clock(), sleep=lambda _: None).round(proportional, POD, EPS, {}, {})
    assert [z.model for z in moved.resizes] == ["b", "a"]  # utilisation alone moves it


class Killed(Exception):
    """The operator's process dies here (SIGKILL: nothing after it runs)."""


def held(pools: dict[str, KVPool]) -> int:
    """What the pools may hold physically: each its limit, or more while a shrink drains."""
    return sum(max(s.limit_bytes, s.physical_bytes) for s in (p.snapshot() for p in pools.values()))


def test_a_server_killed_while_its_shrink_drains_gets_no_grant_issued_against_it(pools: dict[str, KVPool]) -> None:
    fill(pools["a"])
    fragment(pools["b"])  # b drains slowly: its pages stay mapped
    admin = FakeAdmin(pools, BUSY)
    before = pools["b"].snapshot().physical_bytes
    clock = Clock(on_sleep=lambda n: admin.down.add("b") if n == 2 else None)  # b dies mid-wait
    r = Balancer(admin, wait_s=5, clock=clock, sleep=clock.sleep).round(group(), POD, EPS, {}, {}, A_WAS_SHORT)
    assert (r.resizes[0].model, r.resizes[0].status) == ("b", "failed")
    assert clock.sleeps == 2  # it stopped waiting when b stopped answering
    assert not r.balanced
    assert any("grants wait" in p for p in r.problems)
    # whatever a was granted came from free budget, none from b's unreleased memory
    assert pools["a"].snapshot().limit_bytes + before <= 32 * MiB


def test_an_operator_killed_between_shrink_and_grant_restarts_into_a_round_that_completes(
    pools: dict[str, KVPool],
) -> None:
    fill(pools["a"])
    held_b = fragment(pools["b"])
    admin = FakeAdmin(pools, BUSY)
    budget = 32 * MiB
    checks: list[int] = []

    def die(_: int) -> None:
        checks.append(held(pools))
        raise Killed  # mid-wait: the shrink was sent, the grant never

    clock = Clock(on_sleep=die)
    with pytest.raises(Killed):
        Balancer(admin, wait_s=5, clock=clock, sleep=clock.sleep).round(group(), POD, EPS, {}, {}, A_WAS_SHORT)
    assert [c[1] for c in admin.calls] == ["b"]  # the shrink, no grant
    revision = pools["b"].snapshot().pending.revision
    pools["b"].free(held_b)  # b's requests finish while the operator is down: its shrink applies
    pools["b"].maintain()
    checks.append(held(pools))
    # the restarted operator: no memory of the round, a clock an hour behind
    restart = Clock(on_sleep=lambda _: checks.append(held(pools)))
    restart.t -= 3600
    r = Balancer(admin, wait_s=5, clock=restart, sleep=restart.sleep).round(group(), POD, EPS, {}, {}, A_WAS_SHORT)
    checks.append(held(pools))
    assert all(z.status == "applied" for z in r.resizes), r.resizes
    assert any(z.model == "a" for z in r.resizes)  # the grant the killed round never made
    assert pools["b"].snapshot().pending.revision >= revision  # monotonic: nothing came back as stale
    assert max(checks) <= budget, checks  # never more than the budget, at any point seen


def test_shrink_preemptions_that_vllm_counts_late_are_not_read_as_a_lack_of_memory(pools: dict[str, KVPool]) -> None:
    from kvpool_operator.balance import observation

    class Late(FakeAdmin):
        """b's pool preempted for a shrink; vLLM counts those preemptions only a step later."""

        shrink = 0

        def snapshot(self, ep: Endpoint) -> PoolState:
            snap = dataclasses.replace(self._pool(ep).snapshot(), demand=self.demand[ep.model],
                                       shrink_preemptions=self.shrink if ep.model == "b" else 0)  # fmt: skip
            return PoolState.from_json(snap.to_dict())

    admin = Late(pools, {"a": DemandStats(0, 0, 0), "b": DemandStats(0, 0, 3)})
    balancer = Balancer(admin, wait_s=1, clock=Clock(), sleep=lambda _: None)
    first = balancer.round(group(), POD, EPS, {}, {})
    admin.shrink = 2  # the pool counted its two at once: vLLM's 3 less 2 reads 1
    dip = balancer.round(group(), POD, EPS, {}, first.preemption_marks, first.memory)
    assert (dip.snapshots["b"].preemptions, dip.preemption_marks["b"]) == (1, 3)
    admin.demand["b"] = DemandStats(0, 0, 5)  # vLLM counts them with the requests' next output
    later = balancer.round(group(), POD, EPS, {}, dip.preemption_marks, dip.memory)
    assert observation(later.snapshots["b"], dip.preemption_marks["b"]).preemptions == 0  # not 2: nothing new
    assert later.preemption_marks["b"] == 3

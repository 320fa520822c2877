"""Scheduler half over vLLM's real BlockPool: withheld blocks are never handed out, pages are
granted only after every rank acknowledged the map, shrinks drain pages as blocks free, and the
invariants hold after every step."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvpool import ConfigError, Geometry, KVLayout, ModelShape, ResizeResult, ResizeStatus
from kvpool.control import ControlRequest, Resize
from kvpool.vllm.engine.protocol import PageCommand, PageOp, PoolWorkerMetadata
from kvpool.vllm.engine.scheduler_side import SchedulerSide
from kvpool.vllm.engine.settings import ConnectorSettings

pytestmark = pytest.mark.slow  # imports vLLM (~10 s once per session)

SHAPE = ModelShape(num_layers=2, num_kv_heads=1, head_dim=64, dtype_bytes=2, block_size=32)  # 8 KiB blocks
PAGE = 32 << 10  # per layer region: 4 blocks per page


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_side(
    limit_pages: int = 4, pages: int = 16, grow_ahead: int = 4, preempt_after_s: float | None = 0.5,
    clock: Clock | None = None,
) -> SchedulerSide:  # fmt: skip
    from vllm.v1.core.block_pool import BlockPool

    geo = Geometry(SHAPE, KVLayout.PER_LAYER, num_blocks=pages * 4, page_bytes=PAGE)
    settings = ConnectorSettings(
        limit_bytes=limit_pages * geo.page_physical_bytes, page_bytes=PAGE, preempt_after_s=preempt_after_s
    )
    side = SchedulerSide(settings, geo, grow_ahead=grow_ahead, clock=clock or Clock())
    side.bind(BlockPool(num_gpu_blocks=geo.num_blocks, enable_caching=True, hash_block_size=32))
    return side


def ack(side: SchedulerSide, commands: list[PageCommand], failed: dict[int, str] | None = None) -> None:
    failed = failed or {}
    side.on_worker_output(PoolWorkerMetadata(frozenset(c.seq for c in commands) - set(failed), failed))


def run_step(side: SchedulerSide, demand: bool = True) -> list[PageCommand]:
    cmds = side.step(scheduled_tokens=int(demand), demand_blocks=int(demand))
    ack(side, cmds)
    side.check_integrity()
    return cmds


def test_only_page_zero_is_offered_at_start() -> None:
    side = make_side()
    assert side.block_pool.get_num_free_blocks() == 3  # page 0 minus the null block
    assert len(side.withheld) == 60
    side.check_integrity()


def test_pages_are_granted_only_after_the_map_is_acknowledged() -> None:
    side = make_side(grow_ahead=8)
    cmds = side.step(scheduled_tokens=1, demand_blocks=1)
    assert [(c.page, c.op) for c in cmds] == [(1, PageOp.MAP), (2, PageOp.MAP)]
    assert side.block_pool.get_num_free_blocks() == 3  # not yet acknowledged: still withheld
    ack(side, cmds)
    assert side.block_pool.get_num_free_blocks() == 11
    got = side.block_pool.get_new_blocks(11)
    assert sorted(b.block_id for b in got) == list(range(1, 12))  # never a withheld block
    side.check_integrity()


def test_growth_stops_at_the_limit_and_without_demand() -> None:
    side = make_side(limit_pages=3, grow_ahead=100)
    assert run_step(side, demand=False) == []
    run_step(side)
    assert side.table.physical_pages == 3
    assert run_step(side) == []


def test_a_failed_map_is_undone_on_every_rank_and_its_blocks_stay_withheld() -> None:
    side = make_side(grow_ahead=4)
    cmds = side.step(scheduled_tokens=1, demand_blocks=1)
    ack(side, cmds, failed={cmds[0].seq: "mmap refused"})
    assert list(side.errors) == ["map page 1: mmap refused"]
    undo = side.step(scheduled_tokens=0, demand_blocks=0)
    assert [(c.page, c.op) for c in undo] == [(1, PageOp.UNMAP)]
    ack(side, undo)
    assert side.block_pool.get_num_free_blocks() == 3
    side.check_integrity()


def full_side(clock: Clock | None = None, preempt_after_s: float | None = 0.5) -> tuple[SchedulerSide, list[Any]]:
    """Eight pages mapped and every block of them in use (the held blocks returned)."""
    side = make_side(limit_pages=8, grow_ahead=28, preempt_after_s=preempt_after_s, clock=clock)
    run_step(side)
    bp = side.block_pool
    return side, bp.get_new_blocks(bp.get_num_free_blocks())


def test_a_shrink_below_used_pages_is_deferred_until_their_blocks_free() -> None:
    side = make_side(limit_pages=8, grow_ahead=28)
    run_step(side)
    bp = side.block_pool
    held = bp.get_new_blocks(bp.get_num_free_blocks())  # every mapped block in use
    reply = side.resize(2 * side.page_bytes, revision=1)
    assert reply.status is ResizeStatus.DEFERRED
    run_step(side)
    assert side.snapshot().pending.status is ResizeStatus.DEFERRED
    bp.free_blocks(held)
    run_step(side)  # drain: blocks withheld, unmaps sent and acknowledged
    snap = side.snapshot()
    assert snap.pending.status is ResizeStatus.APPLIED
    assert snap.mapped_bytes <= 2 * side.page_bytes
    side.check_integrity()


def test_a_deferred_shrink_names_the_blocks_to_preempt_once_its_grace_is_over() -> None:
    clock = Clock()
    side, held = full_side(clock)
    bp = side.block_pool
    assert side.resize(2 * side.page_bytes, revision=1).status is ResizeStatus.DEFERRED
    clock.now += 0.4
    assert side.shrink_waits_for() == set()  # within the grace: pages drain as requests finish
    clock.now += 0.2
    waited = side.shrink_waits_for()
    draining = {b for p in side.draining for b in side.geometry.blocks_of(p)}
    assert waited == draining  # every used block of every draining page
    assert len(waited) >= 4
    bp.free_blocks([blk for blk in held if blk.block_id in waited])  # what the preemption frees
    side.preempted(2, waited)
    assert waited <= side.withheld  # withheld at once: the step that follows cannot reuse them
    assert not side.outbox  # unmaps wait for the step, which knows what its store jobs read
    run_step(side, demand=False)
    snap = side.snapshot()
    assert (snap.pending.status, snap.shrink_preemptions) == (ResizeStatus.APPLIED, 2)
    assert side.shrink_waits_for() == set()


def test_a_page_a_store_job_of_the_step_reads_is_unmapped_only_in_a_later_step() -> None:
    side, held = full_side()
    bp = side.block_pool
    assert side.resize(2 * side.page_bytes, revision=1).status is ResizeStatus.DEFERRED
    draining = {b for p in side.draining for b in side.geometry.blocks_of(p)}
    bp.free_blocks([blk for blk in held if blk.block_id in draining])
    side.preempted(1, draining)
    read = {min(draining)}  # a block this step's tier stores copy out
    cmds = side.step(scheduled_tokens=1, demand_blocks=0, busy=read)
    unmapped = {c.page for c in cmds if c.op is PageOp.UNMAP}
    assert min(draining) // 4 not in unmapped  # its page stays mapped through the step's stores
    assert unmapped  # the others go
    ack(side, cmds)
    later = side.step(scheduled_tokens=1, demand_blocks=0)
    assert [c.page for c in later if c.op is PageOp.UNMAP] == [min(draining) // 4]
    ack(side, later)
    side.check_integrity()


def test_a_second_cut_while_a_shrink_waits_keeps_the_waits_start() -> None:
    clock = Clock()
    side, _ = full_side(clock)
    assert side.resize(4 * side.page_bytes, revision=1).status is ResizeStatus.DEFERRED
    clock.now += 0.4
    assert side.resize(2 * side.page_bytes, revision=2).status is ResizeStatus.DEFERRED
    clock.now += 0.2
    assert side.shrink_waits_for()  # 0.6 s since the first cut: due, though the second is 0.2 s old


class LoadingTier:
    """The TierView seam: a tier loading into one request's blocks."""

    def held(self, block_hash: bytes) -> bool:
        return False

    def loading(self, request_id: str) -> bool:
        return request_id == "loading"

    def stats(self, demoted: int) -> Any:
        return None

    def check(self) -> None:
        return None


def test_a_request_the_tier_is_loading_into_is_not_preempted() -> None:
    side = make_side()
    assert side.may_preempt("anything")
    side.tier = LoadingTier()
    assert not side.may_preempt("loading")
    assert side.may_preempt("decoding")


def test_without_a_grace_a_deferred_shrink_never_asks_for_preemption() -> None:
    clock = Clock()
    side, _ = full_side(clock, preempt_after_s=None)
    assert side.resize(2 * side.page_bytes, revision=1).status is ResizeStatus.DEFERRED
    clock.now += 3600
    assert side.shrink_waits_for() == set()
    assert side.snapshot().pending.status is ResizeStatus.DEFERRED


def test_trim_releases_idle_pages_and_evicts_their_cached_blocks() -> None:
    side = make_side(limit_pages=8, grow_ahead=28)
    run_step(side)
    bp = side.block_pool
    blocks = bp.get_new_blocks(6)
    bp.free_blocks(blocks)
    pages = side.snapshot().mapped_bytes // side.page_bytes
    trimmed = side.trim()
    # every page but the null block's; the freed blocks carry no hash, so no cached one is evicted
    assert (trimmed.released_pages, trimmed.released_bytes) == (pages - 1, (pages - 1) * side.page_bytes)
    assert trimmed.evicted_blocks == 0
    run_step(side, demand=False)
    assert side.snapshot().mapped_bytes == side.page_bytes  # only the null block's page
    side.check_integrity()


def test_stale_and_conflicting_resizes_change_nothing() -> None:
    side = make_side()
    assert side.resize(3 * side.page_bytes, 2).status is ResizeStatus.APPLIED
    assert side.resize(5 * side.page_bytes, 1).status is ResizeStatus.STALE
    assert side.resize(5 * side.page_bytes, 2).status is ResizeStatus.CONFLICT
    assert side.snapshot().limit_bytes == 3 * side.page_bytes
    with pytest.raises(ConfigError, match="limit_bytes"):
        side.resize(-5, 3)


def test_control_requests_are_served_from_the_mailbox_on_the_engine_thread() -> None:
    side = make_side()
    req = ControlRequest(Resize(2 * side.page_bytes, 7))
    side.mailbox.put(req)
    assert not req.reply.done()
    side.has_work()  # what vLLM's idle loop calls
    result = req.reply.result(timeout=1)
    assert isinstance(result, ResizeResult)
    assert (result.status, result.revision) == (ResizeStatus.APPLIED, 7)
    bad = ControlRequest(Resize(-1, 8))
    side.mailbox.put(bad)
    side.has_work()
    with pytest.raises(ConfigError, match="limit_bytes"):  # reported to the caller; the loop goes on
        bad.reply.result(timeout=1)


def settings_cases() -> list[tuple[dict[str, Any], str]]:
    return [
        ({}, "limit_bytes is required"),
        ({"limit_bytes": 1}, "page_bytes is required"),  # decided once, by PoolEngineConfig
        ({"limit_bytes": 1, "bogus": 2}, "unknown kvpool settings"),
        ({"limit_bytes": "big", "page_bytes": 65536}, "limit_bytes must be an integer"),
        ({"limit_bytes": 1, "page_bytes": 1000}, "page_bytes=1000"),
        ({"limit_bytes": 1, "page_bytes": 65536, "backend": "tpu"}, "bad kvpool setting"),
        ({"limit_bytes": 1, "page_bytes": 65536, "offload_policy": "fifo"}, "offload_policy must be one of"),
        ({"limit_bytes": 1, "backend": "cuda", "page_bytes": 65536}, "multiple of 2 MiB"),
        ({"limit_bytes": 1, "page_bytes": 65536, "preempt_after_s": "soon"}, "preempt_after_s must be a number"),
        ({"limit_bytes": 1, "page_bytes": 65536, "preempt_after_s": -1}, "preempt_after_s must be >= 0"),
    ]


@pytest.mark.parametrize(("raw", "message"), settings_cases())
def test_bad_connector_settings_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ConnectorSettings.from_extra({"kvpool": raw})


def test_settings_round_trip_through_the_connector_json() -> None:
    s = ConnectorSettings(limit_bytes=1 << 20, page_bytes=PAGE, control_address="kvpool-x", model="m")
    assert ConnectorSettings.from_extra(s.to_extra()) == s
    never = ConnectorSettings(limit_bytes=1 << 20, page_bytes=PAGE, preempt_after_s=None)
    assert ConnectorSettings.from_extra(json.loads(json.dumps(never.to_extra()))) == never


def test_a_waiting_request_larger_than_the_margin_gets_all_its_pages_in_one_step() -> None:
    side = make_side(limit_pages=16, grow_ahead=4)
    cmds = side.step(scheduled_tokens=0, demand_blocks=30)  # a long prompt waits for 30 blocks
    ack(side, cmds)
    assert side.block_pool.get_num_free_blocks() >= 30
    side.check_integrity()


def test_a_request_holding_blocks_at_the_head_of_the_queue_grows_the_pool_with_nothing_running() -> None:
    """vLLM looks no request up while one holding blocks (a tier load's) blocks the queue: the
    scheduler reports what that one still needs, once, and the pool grows for it."""
    side = make_side(limit_pages=16, grow_ahead=4)
    side.held_head_blocks = 20
    ack(side, side.step(scheduled_tokens=0, demand_blocks=0))
    assert side.block_pool.get_num_free_blocks() >= 20
    assert side.held_head_blocks == 0  # set again before each step, or no demand
    side.check_integrity()

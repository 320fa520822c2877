"""The node ledger inside a real engine: another process holds part of the budget, so the
engine's pool may map only the rest, whatever its limit; requests wait for memory instead of
failing, every one completes, and the pool stays consistent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.ledger import Ledger
from tests.kvpool.vllm.test_engine import greedy, prompts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1 << 20
BUDGET = 3 * MiB  # of which the test's own owner holds 1 MiB: the engine may map 2 MiB (8 pages)


@pytest.fixture(scope="module")
def ledger_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Ledger]]:
    from kvpool.vllm.launch.args import PoolEngineConfig
    from kvpool.vllm.launch.runner import EngineRunner

    path = tmp_path_factory.mktemp("ledger") / "ledger"
    other = Ledger(f"{path}-dev0", "other-model:0", BUDGET)  # what the engine's worker opens
    other.debit(1 * MiB)
    config = PoolEngineConfig(model=str(tiny_model), limit_bytes=512 * MiB, virtual_bytes=1024 * MiB,
                              ledger_bytes=BUDGET, ledger_path=str(path))  # fmt: skip
    runner = EngineRunner(str(tiny_model), config, max_model_len=2048)
    yield runner, other
    runner.close()
    other.close()


def test_the_engine_maps_only_what_the_ledger_leaves_and_every_request_completes(ledger_engine: Any) -> None:
    engine, other = ledger_engine
    used: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            used.append(other.state().used_bytes)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = engine.generate(prompts(4, 600, seed=7), greedy(32))  # ~21 blocks each: one at a time fits
    finally:
        done.set()
        watcher.join()
    assert [len(c.token_ids) for c in out] == [32] * 4
    assert max(used) <= BUDGET
    assert max(used) > 2 * MiB  # the engine did grow into what was left
    snap = engine.snapshot()
    assert snap.limit_bytes == 512 * MiB  # the limit allowed far more: the ledger held it back
    assert snap.mapped_bytes + snap.reserve_bytes <= BUDGET - 1 * MiB
    engine.check_integrity()


def test_memory_the_other_owner_gives_back_is_used(ledger_engine: Any) -> None:
    engine, other = ledger_engine
    other.credit(1 * MiB)
    out = engine.generate(prompts(3, 600, seed=8), greedy(16))
    assert [len(c.token_ids) for c in out] == [16] * 3
    assert engine.snapshot().mapped_bytes > 2 * MiB
    assert other.state().used_bytes <= BUDGET
    engine.check_integrity()

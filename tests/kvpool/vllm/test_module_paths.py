"""vLLM loads our connector and our tier spec by module path: the strings the flags carry are
the classes' own ``__module__`` (strings, so that building flags does not import vLLM)."""

from __future__ import annotations

import pytest

from kvpool.vllm.engine.settings import TIER_SPEC
from kvpool.vllm.launch.args import CONNECTOR, SCHEDULER

pytestmark = pytest.mark.slow  # imports vLLM


def test_the_flags_name_the_modules_the_classes_live_in() -> None:
    from kvpool.vllm.engine.connector import KVPoolConnector
    from kvpool.vllm.engine.preemption import pool_scheduler
    from kvpool.vllm.tier.worker import KVPoolOffloadingSpec

    assert (KVPoolConnector.__module__, KVPoolConnector.__name__) == CONNECTOR
    assert (KVPoolOffloadingSpec.__module__, KVPoolOffloadingSpec.__name__) == TIER_SPEC
    assert f"{pool_scheduler.__module__}.{pool_scheduler.__name__}" == SCHEDULER

"""Fixtures for kvpool tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvpool import KVPool
from tests.kvpool.factories import make_config


@pytest.fixture
def make_pool() -> Iterator[Any]:
    """``make_pool(**config_overrides)`` -> a KVPool on the host backend, closed after the test."""
    pools: list[KVPool] = []

    def factory(**overrides: Any) -> KVPool:
        pool = KVPool(make_config(**overrides))
        pools.append(pool)
        return pool

    yield factory
    for pool in pools:
        pool.close()

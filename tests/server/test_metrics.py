"""The resize series of kvpool-server (``ResizeTimer``) over a registry of their own: memory moved
by accepted resizes, and the age of the oldest deferred shrink until a snapshot shows it applied."""

from __future__ import annotations

import time

from kvpool_server.metrics import ResizeTimer
from prometheus_client import CollectorRegistry

from kvpool import PendingResize, PoolSnapshot, ResizeStatus

MiB = 1 << 20


def pending(status: ResizeStatus, revision: int) -> PoolSnapshot:
    return PoolSnapshot("m", "BLNHC", MiB, 64 << 10, 16, 64 * MiB, 32 * MiB, 32 * MiB, 0, 0, 0, 0,
                        PendingResize(32 * MiB, revision, status))  # fmt: skip


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, {"model": "m", **labels})
    assert v is not None, name
    return v


def test_accepted_resizes_count_the_limit_bytes_they_move_and_refused_ones_do_not() -> None:
    reg = CollectorRegistry()
    timer = ResizeTimer(reg, "m")
    timer.answered(1, before=64 * MiB, after=96 * MiB, status=ResizeStatus.APPLIED, elapsed_s=0.01)
    timer.answered(2, before=96 * MiB, after=32 * MiB, status=ResizeStatus.DEFERRED, elapsed_s=0.01)
    timer.answered(1, before=32 * MiB, after=128 * MiB, status=ResizeStatus.STALE, elapsed_s=0.01)
    assert sample(reg, "kvpool_resize_bytes_total", direction="grow") == 32 * MiB
    assert sample(reg, "kvpool_resize_bytes_total", direction="shrink") == 64 * MiB
    assert sample(reg, "kvpool_resize_seconds_count", direction="grow") == 1
    assert sample(reg, "kvpool_resize_seconds_count", direction="shrink") == 0  # still deferred


def test_the_deferred_age_grows_until_the_shrink_is_applied_then_reads_zero() -> None:
    reg = CollectorRegistry()
    timer = ResizeTimer(reg, "m")
    assert sample(reg, "kvpool_resize_deferred_seconds") == 0
    timer.answered(5, before=96 * MiB, after=32 * MiB, status=ResizeStatus.DEFERRED, elapsed_s=0.2)
    first = sample(reg, "kvpool_resize_deferred_seconds")
    time.sleep(0.05)
    assert sample(reg, "kvpool_resize_deferred_seconds") > first >= 0.2
    timer.seen(pending(ResizeStatus.DEFERRED, 5))
    assert sample(reg, "kvpool_resize_deferred_seconds") > 0
    timer.seen(pending(ResizeStatus.APPLIED, 5))
    assert sample(reg, "kvpool_resize_deferred_seconds") == 0
    assert sample(reg, "kvpool_resize_seconds_count", direction="shrink") == 1

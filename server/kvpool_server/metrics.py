"""``kvpool_*`` metrics on vLLM's registry: one ``/metrics`` for both, values from the snapshot.

The snapshot lives in the engine process; a scrape fetches it first (our ``/metrics`` route, put
ahead of vLLM's in ``app.py``), then the collector turns the :class:`PoolSnapshot` into metric
families. Base units, ``_total`` counters, one ``model`` label (plus ``state`` / ``status`` /
``direction``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvpool import OffloadStats, PoolSnapshot, ResizeStatus

GAUGES = {
    "kvpool_limit_bytes": ("limit_bytes", "Physical KV bytes the pool may back (effective: whole pages)."),
    "kvpool_mapped_bytes": ("mapped_bytes", "KV bytes backed by physical memory and holding blocks."),
    "kvpool_virtual_bytes": ("virtual_bytes", "Reserved virtual KV address space."),
    "kvpool_reserve_bytes": ("reserve_bytes", "Physical bytes backed ahead of use (not yet holding blocks)."),
    "kvpool_block_bytes": ("block_bytes", "Bytes of one KV block (all layers): used bytes = used blocks x this."),
}
OFFLOAD_COUNTERS = {
    "kvpool_offload_hits": ("hits", "Prefix blocks served from the CPU offload tier."),
    "kvpool_offload_misses": ("misses", "Prefix lookups the CPU offload tier could not serve."),
    "kvpool_demoted_blocks": ("demoted_blocks", "Cached blocks moved to the CPU tier when pages were released."),
}
NO_TIER = OffloadStats(0, 0, 0, 0, 0, 0, 0)


class PoolCollector(Collector):
    """Metric families from the latest snapshot (``None`` = the engine did not answer)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.latest: PoolSnapshot | None = None

    def describe(self) -> list[Metric]:
        return []  # collect() needs a live snapshot; do not call it at registration

    def collect(self) -> Iterator[Metric]:
        snap, m = self.latest, [self.model]
        up = GaugeMetricFamily("kvpool_up", "1 when the pool's engine answered the last scrape.", labels=["model"])
        up.add_metric(m, 0.0 if snap is None else 1.0)
        yield up
        if snap is None:
            return
        for name, (key, doc) in GAUGES.items():
            g = GaugeMetricFamily(name, doc, labels=["model"])
            g.add_metric(m, float(getattr(snap, key)))
            yield g
        blocks = GaugeMetricFamily("kvpool_blocks", "Blocks in backed pages by state.", labels=["model", "state"])
        for state in ("used", "cached", "free"):
            blocks.add_metric([*m, state], float(getattr(snap, f"{state}_blocks")))
        yield blocks
        resizes = CounterMetricFamily("kvpool_resize", "Resize requests by outcome.", labels=["model", "status"])
        for status in ResizeStatus:
            resizes.add_metric([*m, status.value], float(snap.resizes.get(status.value, 0)))
        yield resizes
        preempted = CounterMetricFamily(
            "kvpool_shrink_preemptions", "Requests preempted to finish a deferred shrink (--preempt-after-s).",
            labels=["model"],
        )  # fmt: skip
        preempted.add_metric(m, float(snap.shrink_preemptions))
        yield preempted
        yield from self._offload(snap.offload or NO_TIER, m)

    def _offload(self, off: OffloadStats, m: list[str]) -> Iterator[Metric]:
        """Zeros while the tier is off: the series exist, so dashboards and alerts resolve."""
        for name, key, doc in (
            ("kvpool_offload_capacity_bytes", "capacity_bytes", "CPU offload tier size (0 = off)."),
            ("kvpool_offload_used_bytes", "used_bytes", "Bytes held in the CPU offload tier."),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model"])
            g.add_metric(m, float(getattr(off, key)))
            yield g
        moved = CounterMetricFamily(
            "kvpool_offload_bytes", "Bytes moved by the CPU tier (in = loads to the pool, out = stores).",
            labels=["model", "direction"],
        )  # fmt: skip
        moved.add_metric([*m, "in"], float(off.bytes_in))
        moved.add_metric([*m, "out"], float(off.bytes_out))
        yield moved
        for name, (key, doc) in OFFLOAD_COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=["model"])
            c.add_metric(m, float(getattr(off, key)))
            yield c


class ResizeTimer:
    """The resize series: ``kvpool_resize_seconds{direction}`` from the PUT to the moment the pool
    reports it applied (at once, or -- for a deferred shrink -- in a later snapshot);
    ``kvpool_resize_bytes_total{direction}``, the limit moved by accepted resizes (divided by the
    count of resizes: memory moved per resize); ``kvpool_resize_deferred_seconds``, how long the
    oldest deferred shrink has waited (0 when none: what an operator of the stack asks first)."""

    def __init__(self, registry: Any, model: str) -> None:
        self.histogram = Histogram(
            "kvpool_resize_seconds", "Time from a limit change to mapped memory within the new limit.",
            ["model", "direction"], registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
        )  # fmt: skip
        self.moved = Counter(
            "kvpool_resize_bytes", "Limit bytes moved by accepted (applied or deferred) resizes.",
            ["model", "direction"], registry=registry,
        )  # fmt: skip
        deferred = Gauge(
            "kvpool_resize_deferred_seconds", "Age of the oldest deferred shrink (0 when none is deferred).",
            ["model"], registry=registry,
        )  # fmt: skip
        deferred.labels(model).set_function(self.deferred_s)
        self.model = model
        self._open: dict[int, tuple[str, float]] = {}  # revision -> (direction, start)
        for direction in ("grow", "shrink"):  # the series exist before the first resize
            self.histogram.labels(model, direction)
            self.moved.labels(model, direction)

    def answered(self, revision: int, before: int, after: int, status: ResizeStatus, elapsed_s: float) -> None:
        """The PUT from limit ``before`` to ``after`` returned ``status`` after ``elapsed_s``; a
        deferred one stays open until a snapshot shows it applied."""
        direction = "grow" if after >= before else "shrink"
        if status in (ResizeStatus.APPLIED, ResizeStatus.DEFERRED):
            self.moved.labels(self.model, direction).inc(abs(after - before))
        if status is ResizeStatus.APPLIED:
            self.histogram.labels(self.model, direction).observe(elapsed_s)
        elif status is ResizeStatus.DEFERRED:
            self._open[revision] = (direction, time.monotonic() - elapsed_s)

    def seen(self, snapshot: PoolSnapshot) -> None:
        pending = snapshot.pending
        if pending.status is not ResizeStatus.APPLIED:
            return
        for revision in [r for r in self._open if r <= pending.revision]:
            direction, start = self._open.pop(revision)
            self.histogram.labels(self.model, direction).observe(time.monotonic() - start)

    def deferred_s(self) -> float:
        return max((time.monotonic() - start for _, start in self._open.values()), default=0.0)

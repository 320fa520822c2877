"""Tier: vLLM's OffloadingConnector as the pool's connector drives it, plus the tier's accounts.

The pool connector owns one (when ``offload_bytes`` > 0) and forwards the offloading hooks to it;
this class adds what the pool needs on top:

* worker side: ``fence()`` -- submit the stores vLLM deferred to the next step and wait for every
  transfer in flight, so a page is never unmapped under a copy;
* scheduler side: hit/miss/byte counters and ``held()`` (is a block's copy in the tier?), which
  the pool uses to count blocks *demoted* when a shrink drops them from the pool; and the answer
  to a failed load (below).

A load the worker could not serve (a chunk whose store failed, a store file cut under it) comes
back as ``invalid_block_ids``; vLLM then reschedules the request to recompute those blocks. But
vLLM's tier index still lists the lost blocks as stored, so the rescheduled request would look
them up, load, fail and be rescheduled again, for ever (seen: a livelock). So any load error
empties the index (vLLM's own ``reset_cache``: in-flight jobs flushed, their late completions
ignored): the request recomputes, and the tier fills again from the next stores. Load errors are
rare (a fault, not a workload), so dropping the whole index rather than picking out the lost keys
costs little, and stays on vLLM's tested path rather than editing its reference counts.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from kvpool.errors import ConfigError
from kvpool.snapshot import OffloadStats
from kvpool.vllm.engine.settings import ConnectorSettings
from kvpool.vllm.tier.worker import KVPoolOffloadingSpec, TierWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

_PROBE = ReqContext(req_id="kvpool-demotion-probe")


def tier_config(extra: dict[str, Any], settings: ConnectorSettings) -> None:
    """Fill the keys vLLM's offloading connector reads from our settings (a hand-written
    ``--kv-transfer-config`` may carry only ``kvpool.offload_bytes``); refuse contradictions."""
    for key, value in settings.tier_extra().items():
        if extra.setdefault(key, value) != value:
            raise ConfigError(f"kv_connector_extra_config.{key}={extra[key]!r} contradicts kvpool settings ({value!r})")


class Tier:
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        self.connector = OffloadingConnector(vllm_config, role, kv_cache_config)
        # the connector keeps its spec to itself; a twin (cheap: it allocates nothing until asked
        # for a manager or worker) gives the tier's sizing
        self._sizing = KVPoolOffloadingSpec(build_offloading_config(vllm_config, kv_cache_config))
        self.block_size = vllm_config.cache_config.block_size
        self.hits = self.misses = self.bytes_in = self.bytes_out = 0
        self._lookups: dict[str, int] = {}  # request -> tokens the pool's prefix cache had

    # ---- worker side ----------------------------------------------------------------------------

    @property
    def worker(self) -> TierWorker | None:
        w = self.connector.connector_worker
        return w.spec.tier_worker if w is not None else None  # type: ignore[attr-defined]

    def fence(self) -> None:
        if self.connector.connector_worker is None or self.worker is None:
            return
        # an empty preemption round submits the stores vLLM deferred to the next step
        self.connector.connector_worker.handle_preemptions(OffloadingConnectorMetadata({}, {}, None))
        self.worker.fence()

    def load_errors(self) -> set[int]:
        return self.worker.take_load_errors() if self.worker else set()

    # ---- scheduler side -------------------------------------------------------------------------

    def lookup(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._lookups[request.request_id] = num_computed_tokens
        return self.connector.get_num_new_matched_tokens(request, num_computed_tokens)

    def allocated(self, request: Request, num_external_tokens: int) -> None:
        """Count hits and misses once per admitted request (lookups may repeat while it waits)."""
        local = self._lookups.pop(request.request_id, None)
        if local is None:
            return
        hit = num_external_tokens // self.block_size
        self.hits += hit
        self.misses += max(0, request.num_prompt_tokens // self.block_size - local // self.block_size - hit)

    def store_sources(self, meta: OffloadingConnectorMetadata) -> set[int]:
        """Pool blocks this step's store jobs will read (they must stay mapped until then)."""
        return {int(b) for job in meta.store_jobs.values() for b in job.src_spec.block_ids}  # type: ignore[attr-defined]

    def on_output(self, output: KVConnectorOutput, meta: Any) -> None:
        if isinstance(meta, OffloadingWorkerMetadata):
            self.bytes_in += meta.transfer_stats.load.bytes
            self.bytes_out += meta.transfer_stats.store.bytes
        self.connector.update_connector_output(dataclasses.replace(output, kv_connector_worker_meta=meta))
        if output.invalid_block_ids:  # after the failed jobs completed above: see the module's docstring
            log.error("kvpool tier: %d blocks failed to load; they are recomputed and the tier's index is emptied",
                      len(output.invalid_block_ids))  # fmt: skip
            self.connector.reset_cache()

    def loading(self, request_id: str) -> bool:
        """Is a load from the tier into this request's blocks still in flight? (vLLM's offloading
        scheduler flushes a preempted request's stores, but asserts it has no load: the load would
        write blocks the preemption freed.)"""
        sched: Any = self.connector.scheduler
        status = sched._req_status.get(request_id)
        return status is not None and any(not sched._jobs[j].is_store for j in status.transfer_jobs)

    def held(self, block_hash: bytes) -> bool:
        """Does the tier hold (or is it storing) this block? (vLLM's block hash with its group
        id is the offload key of group 0.)"""
        result = self.connector.scheduler.manager.lookup(OffloadKey(block_hash), _PROBE)
        return result in (LookupResult.HIT, LookupResult.HIT_PENDING)

    def check(self) -> None:
        """The tier's invariants (AssertionError names the broken one): its chunks are handed out
        at most once, it never holds more than its capacity, and its counters are consistent."""
        manager: Any = self.connector.scheduler.manager
        allocated, free = manager._num_allocated_chunks, manager._free_list
        if not 0 <= allocated <= self._sizing.num_chunks:
            raise AssertionError(f"tier handed out {allocated} chunks of {self._sizing.num_chunks}")
        if len(set(free)) != len(free) or any(not 0 <= c < allocated for c in free):
            raise AssertionError(f"tier free list is corrupt: {sorted(free)[:8]}...")
        if self.hits < 0 or self.misses < 0 or self.bytes_in < 0 or self.bytes_out < 0:
            raise AssertionError("tier counters went negative")

    def stats(self, demoted: int) -> OffloadStats:
        spec = self._sizing
        manager: Any = self.connector.scheduler.manager
        # vLLM's CPU manager has no public occupancy count; chunks handed out minus chunks freed
        used = manager._num_allocated_chunks - len(manager._free_list)
        return OffloadStats(
            capacity_bytes=spec.num_chunks * spec.kv_bytes_per_chunk,
            used_bytes=used * spec.kv_bytes_per_chunk,
            hits=self.hits,
            misses=self.misses,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            demoted_blocks=demoted,
        )

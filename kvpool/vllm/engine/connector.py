"""KVPoolConnector: the pool inside a vLLM engine, through vLLM's external KV-connector API.

Load it with ``--kv-transfer-config`` (``kvpool.vllm.launch.args`` builds it)::

    {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm.engine.connector",
     "kv_role": "kv_both", "kv_connector_extra_config": {"kvpool": {"limit_bytes": ..., ...}}}

One instance per role: the SCHEDULER instance (engine core) decides pages over vLLM's BlockPool
(:mod:`kvpool.vllm.engine.scheduler_side`); each WORKER instance (one per tensor-parallel rank) owns a
VMM reservation holding that rank's KV shard (:mod:`kvpool.vllm.engine.worker_side`). With
``offload_bytes`` > 0 it also drives the CPU tier (:mod:`kvpool.vllm.tier.offloading`: vLLM's offloading
connector with our transfers), and orders the two:

    scheduler step:  tier jobs first --> pool step (never withholds a block a store job reads)
    worker step:     [fence: deferred stores submitted, transfers waited -- only if unmapping]
                     --> page commands --> tier loads --> forward --> tier stores queued

One connector rather than vLLM's MultiConnector because of that ordering: a page must not be
unmapped while a store that reads it is queued or in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

from kvpool.control import ControlServer
from kvpool.vllm.engine.geometry import geometry_from_kv_cache_config
from kvpool.vllm.engine.protocol import PageOp, PoolMetadata, PoolWorkerMetadata
from kvpool.vllm.engine.scheduler_side import SchedulerSide
from kvpool.vllm.engine.settings import ConnectorSettings
from kvpool.vllm.engine.worker_side import WorkerSide
from kvpool.vllm.tier.offloading import Tier, tier_config

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


class KVPoolConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.settings = ConnectorSettings.from_extra(extra)
        geometry = geometry_from_kv_cache_config(kv_cache_config, self.settings.page_bytes)
        self.tier: Tier | None = None
        if self.settings.offload_bytes:
            tier_config(extra, self.settings)
            self.tier = Tier(vllm_config, role, kv_cache_config)
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        self._control: ControlServer | None = None
        self._demand = 0  # blocks the largest waiting request of this step needs
        self._block_size = geometry.shape.block_size
        if role is KVConnectorRole.SCHEDULER:
            sched = vllm_config.scheduler_config
            # half a step's worth of prefill blocks: a burst beyond that waits one step for its pages
            half_step = sched.max_num_batched_tokens // geometry.shape.block_size // 2
            grow_ahead = self.settings.grow_ahead_blocks or max(2 * geometry.blocks_per_page, half_step)
            self.scheduler = SchedulerSide(self.settings, geometry, grow_ahead, self.tier)
            if self.settings.control_address:
                self._control = ControlServer(
                    self.settings.control_address, self.scheduler.mailbox, self.settings.control_timeout_s
                )
        else:
            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
            self.worker = WorkerSide(self.settings, geometry, device=device)
        log.info(
            "kvpool %s: %s layout, %d virtual blocks, %d per page, limit %d bytes",
            role.name,
            geometry.layout.value,
            geometry.num_blocks,
            geometry.blocks_per_page,
            self.settings.limit_bytes,
        )

    # ---- worker side -----------------------------------------------------------------------------

    def get_mem_pool_context(self) -> AbstractContextManager[Any] | None:
        return self.worker.allocation_context() if self.worker else None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self.worker:
            self.worker.check_views(kv_caches)
        if self.tier:
            self.tier.connector.register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self.tier and isinstance(kv_connector_metadata, PoolMetadata) and kv_connector_metadata.tier:
            self.tier.connector.handle_preemptions(kv_connector_metadata.tier)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if not isinstance(connector_metadata, PoolMetadata):
            return
        if self.worker:
            if self.tier and any(c.op is PageOp.UNMAP for c in connector_metadata.commands):
                self.tier.fence()  # no copy may still read a page we unmap
            self.worker.apply(connector_metadata)  # before the forward pass touches any block
        if self.tier and connector_metadata.tier:
            self.tier.connector.bind_connector_metadata(connector_metadata.tier)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self.tier and self.tier.connector.has_connector_metadata():
            self.tier.connector.clear_connector_metadata()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self.tier and self.tier.connector.has_connector_metadata():
            self.tier.connector.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        if self.tier and self.tier.connector.has_connector_metadata():
            self.tier.connector.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.tier and self.tier.connector.has_connector_metadata():
            return self.tier.connector.get_finished(finished_req_ids)
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.tier.load_errors() if self.tier else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        pool = self.worker.take_results() if self.worker else None
        tier = self.tier.connector.build_connector_worker_meta() if self.tier else None
        if tier is None:
            return pool
        return PoolWorkerMetadata(pool.done, pool.failed, tier) if pool else PoolWorkerMetadata(tier=tier)

    # ---- scheduler side --------------------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self.tier:
            self.tier.connector.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        if self.scheduler:
            self.scheduler.bind(gpu_block_pool)

    def on_new_request(self, request: Request) -> None:
        if self.tier:
            self.tier.connector.on_new_request(request)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        # A waiting request is being considered: make sure its whole prompt can get blocks, even
        # if that is more than the grow-ahead margin (vLLM will not schedule a partial prompt).
        need = -(-max(request.num_tokens - num_computed_tokens, 1) // self._block_size)
        self._demand = max(self._demand, need)
        return self.tier.lookup(request, num_computed_tokens) if self.tier else (0, False)

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> Any:
        if self.tier:
            return self.tier.connector.get_external_cache_hit_sources(request, num_external_tokens)
        return super().get_external_cache_hit_sources(request, num_external_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if self.tier:
            self.tier.allocated(request, num_external_tokens)
            self.tier.connector.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self.scheduler is not None
        demand, self._demand = self._demand, 0
        tier_meta = self.tier.connector.build_connector_meta(scheduler_output) if self.tier else None
        busy = self.tier.store_sources(tier_meta) if self.tier and tier_meta else set()  # type: ignore[arg-type]
        commands = self.scheduler.step(scheduler_output.total_num_scheduled_tokens, demand, busy)
        return PoolMetadata(commands, tier_meta)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        pool = meta if isinstance(meta, PoolWorkerMetadata) else None
        if self.scheduler:
            self.scheduler.on_worker_output(pool)
        if self.tier:
            self.tier.on_output(connector_output, pool.tier if pool else None)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.tier.connector.request_finished(request, block_ids) if self.tier else (False, None)

    def has_pending_push_work(self) -> bool:
        pool = self.scheduler.has_work() if self.scheduler else False
        return pool or bool(self.tier and self.tier.connector.has_pending_push_work())

    def take_events(self) -> Iterable[Any]:
        return self.tier.connector.take_events() if self.tier else ()

    def reset_cache(self) -> bool | None:
        return self.tier.connector.reset_cache() if self.tier else None

    def get_kv_connector_stats(self) -> Any:
        return self.tier.connector.get_kv_connector_stats() if self.tier else None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # the tier is a best-effort cache: a dropped store is a later miss

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> Any:
        return OffloadingConnector.build_kv_connector_stats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, *args: Any) -> Any:
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config  # type: ignore[union-attr]
        if ConnectorSettings.from_extra(extra).offload_bytes:
            return OffloadingConnector.build_prom_metrics(vllm_config, *args)
        return super().build_prom_metrics(vllm_config, *args)

    def shutdown(self) -> None:
        if self._control:
            self._control.close()
        if self.tier:
            self.tier.connector.shutdown()

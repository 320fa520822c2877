"""KVPoolConnector: the pool inside a vLLM engine, through vLLM's external KV-connector API.

Load it with ``--kv-transfer-config`` (``kvpool.vllm.args`` builds it)::

    {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm.connector",
     "kv_role": "kv_both", "kv_connector_extra_config": {"kvpool": {"limit_bytes": ..., ...}}}

One instance per role: the SCHEDULER instance (engine core) decides pages over vLLM's BlockPool
(:mod:`kvpool.vllm.scheduler_side`); each WORKER instance (one per tensor-parallel rank) owns a
VMM reservation holding that rank's KV shard (:mod:`kvpool.vllm.worker_side`). This class only
routes vLLM's hooks to them; it moves no KV data.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

from kvpool.vllm.control import ControlServer
from kvpool.vllm.geometry import geometry_from_kv_cache_config
from kvpool.vllm.protocol import PoolMetadata, PoolWorkerMetadata
from kvpool.vllm.scheduler_side import ControlRequest, SchedulerSide
from kvpool.vllm.settings import ConnectorSettings
from kvpool.vllm.worker_side import WorkerSide

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
            self.scheduler = SchedulerSide(self.settings, geometry, grow_ahead)
            if self.settings.control_address:
                self._control = ControlServer(
                    self.settings.control_address,
                    self.scheduler.mailbox,
                    self.settings.control_timeout_s,
                    lambda op, args: ControlRequest(op, args),
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

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker and isinstance(connector_metadata, PoolMetadata):
            self.worker.apply(connector_metadata)  # before the forward pass touches any block

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return  # the pool moves no KV data (the offload tier does, in its own connector)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self.worker.take_results() if self.worker else None

    # ---- scheduler side --------------------------------------------------------------------------

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        if self.scheduler:
            self.scheduler.bind(gpu_block_pool)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        # A waiting request is being considered: make sure its whole prompt can get blocks, even
        # if that is more than the grow-ahead margin (vLLM will not schedule a partial prompt).
        need = -(-max(request.num_tokens - num_computed_tokens, 1) // self._block_size)
        self._demand = max(self._demand, need)
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        return

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self.scheduler is not None
        demand, self._demand = self._demand, 0
        return PoolMetadata(self.scheduler.step(scheduler_output.total_num_scheduled_tokens, demand))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self.scheduler:
            meta = connector_output.kv_connector_worker_meta
            self.scheduler.on_worker_output(meta if isinstance(meta, PoolWorkerMetadata) else None)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def has_pending_push_work(self) -> bool:
        return self.scheduler.has_work() if self.scheduler else False

    def shutdown(self) -> None:
        if self._control:
            self._control.close()

"""The CPU tier inside vLLM: vLLM's offloading scheduler and policies, our worker-side transfers.

vLLM's ``OffloadingConnector`` decides *what* moves (lookups, LRU/ARC eviction, store and load
jobs, ``vllm:kv_offload_*`` metrics); its built-in CPU worker refuses anything but CUDA. This
spec keeps vLLM's manager and supplies :class:`TierWorker`, which copies whole pool blocks into
a :class:`~kvpool.offload.HostBlockStore`: plain memory copies on the CPU, and asynchronous copies
on their own CUDA stream (ordered after the step's compute) into pinned memory on GPUs.

Failure rule: vLLM's offloading worker asserts that every transfer succeeds, so a failed copy is
reported as finished and remembered here instead. A chunk whose store failed is *poisoned*; a
load from it copies nothing and reports the destination blocks through
``get_block_ids_with_load_errors``, so vLLM recomputes them (``kv_load_failure_policy=recompute``)
-- a block is never served corrupt, and neither tier is left inconsistent. A store file cut under
the worker (:meth:`HostBlockStore.restore_if_cut`) poisons every chunk at once. The scheduler half
answers any load error by emptying vLLM's tier index (:meth:`Tier.on_output`): otherwise the
rescheduled request would look the same lost blocks up again, for ever.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from kvpool.errors import ConfigError
from kvpool.offload import BlockRegion, HostBlockStore, StoreDamaged, copy_blocks, reap_stale
from kvpool.offload.store import chunk_layout
from kvpool.vllm.engine.settings import ConnectorSettings

log = logging.getLogger(__name__)

SPEC_NAME = "KVPoolOffloadingSpec"


class _PoisonedChunk(Exception):
    pass


def block_regions(kv_caches: CanonicalKVCaches) -> tuple[list[BlockRegion], int]:
    """The pieces of one block, in chunk order: one region in the uniform layout (vLLM sees a
    packed block), one per layer in the per-layer layout."""
    if len(kv_caches.group_data_refs) != 1:
        raise ConfigError(
            f"the kvpool CPU tier supports models with one KV cache group, got {len(kv_caches.group_data_refs)}"
        )
    seen: set[int] = set()
    pieces = []
    for ref in kv_caches.group_data_refs[0]:
        if ref.tensor_idx in seen:  # layers that alias the same bytes move once
            continue
        seen.add(ref.tensor_idx)
        pieces.append(kv_caches.tensors[ref.tensor_idx].tensor[:, : ref.page_size_bytes])
    return chunk_layout(pieces)


class TierWorker(OffloadingWorker):
    """Moves blocks between one rank's pool and its host store; synchronous on the CPU."""

    def __init__(self, regions: list[BlockRegion], store: HostBlockStore, cuda: bool) -> None:
        self.regions, self.store = regions, store
        self._stream = torch.cuda.Stream() if cuda else None
        self._done: list[TransferResult] = []
        self._pending: dict[int, tuple[Any, int, float]] = {}  # CUDA: job -> (event, bytes, start)
        self._poisoned: set[int] = set()
        self._load_errors: set[int] = set()

    def submit_store(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        self._transfer(job_id, _ids(src_spec), _ids(dst_spec), to_store=True)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        self._transfer(job_id, _ids(dst_spec), _ids(src_spec), to_store=False)
        return True

    def _transfer(self, job_id: int, blocks: list[int], chunks: list[int], to_store: bool) -> None:
        start = time.perf_counter()
        moved = 0
        try:
            if self.store.restore_if_cut():  # before the copy: a copy into a cut file faults
                log.error("kvpool tier: %s was cut under the worker; every stored block is lost", self.store.path)
                self._poisoned.update(range(self.store.num_chunks))
            if not to_store and self._poisoned.intersection(chunks):
                raise _PoisonedChunk(f"chunks {sorted(self._poisoned.intersection(chunks))} hold a failed store")
            moved = self._copy(blocks, chunks, to_store)
            if to_store:
                self._poisoned.difference_update(chunks)
        except (RuntimeError, IndexError, ValueError, _PoisonedChunk, StoreDamaged) as e:
            log.error("kvpool tier: %s job %d failed: %s", "store" if to_store else "load", job_id, e)
            (self._poisoned if to_store else self._load_errors).update(chunks if to_store else blocks)
        if self._stream is None:
            self._done.append(TransferResult(job_id, True, moved, time.perf_counter() - start))
        else:
            event = torch.cuda.Event()
            event.record(self._stream)
            self._pending[job_id] = (event, moved, start)

    def _copy(self, blocks: list[int], chunks: list[int], to_store: bool) -> int:
        if self._stream is None:
            return copy_blocks(self.regions, self.store.tensor, blocks, chunks, to_store)
        self._stream.wait_stream(torch.cuda.current_stream())  # after the step that wrote the blocks
        with torch.cuda.stream(self._stream):
            return copy_blocks(self.regions, self.store.tensor, blocks, chunks, to_store, non_blocking=True)

    def get_finished(self) -> list[TransferResult]:
        for job_id, (event, moved, start) in list(self._pending.items()):
            if event.query():
                del self._pending[job_id]
                self._done.append(TransferResult(job_id, True, moved, time.perf_counter() - start))
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids & self._pending.keys():
            self._pending[job_id][0].synchronize()

    def fence(self) -> None:
        """Wait for every transfer in flight (before pages they may touch are unmapped)."""
        self.wait(set(self._pending))

    def take_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        self.fence()
        self.store.close()


def _ids(spec: LoadStoreSpec) -> list[int]:
    return [int(i) for i in spec.block_ids]  # type: ignore[attr-defined]


class KVPoolOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec (manager, sizing, metrics) with :class:`TierWorker` transfers."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ConfigError("the kvpool CPU tier moves whole pool blocks: leave blocks_per_chunk/block_size unset")
        self.settings = ConnectorSettings.from_extra(dict(self.extra_config))
        self.tier_worker: TierWorker | None = None

    def _uses_shared_region(self) -> bool:
        return False  # the store is ours (HostBlockStore), not vLLM's shared region

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self.tier_worker is None:
            regions, chunk_bytes = block_regions(kv_caches)
            cuda = kv_caches.tensors[0].tensor.is_cuda
            directory = Path(self.settings.offload_dir)
            for stale in reap_stale(directory):
                log.warning("kvpool tier: removed %s, left by a worker that is gone", stale)
            name = f"kvpool-tier-{_safe(self.settings.model)}-{os.getpid()}-r{self.config.parallel.rank}"
            store = HostBlockStore(directory / name, self.num_chunks, chunk_bytes, pin=cuda)
            self.tier_worker = TierWorker(regions, store, cuda)
            log.info("kvpool tier: %d chunks x %d bytes in %s (%d pieces per block)",
                     self.num_chunks, chunk_bytes, store.path, len(regions))  # fmt: skip
        return self.tier_worker


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

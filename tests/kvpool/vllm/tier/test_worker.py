"""TierWorker on real tensors (no engine): whole-block moves in both layouts, one copy per block in
the uniform layout, and the failure rule -- a failed store poisons its chunks, a load from them
copies nothing and reports its blocks for recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from kvpool.offload import HostBlockStore
from kvpool.vllm.tier.worker import TierWorker, block_regions

BLOCKS, LAYERS, PIECE = 8, 4, 256


def caches(uniform: bool) -> CanonicalKVCaches:
    """The canonical view vLLM builds of our pool: one packed tensor (uniform) or one per layer."""
    data = (torch.arange(BLOCKS * LAYERS * PIECE) % 253).to(torch.int8)
    if uniform:
        t = data.view(BLOCKS, LAYERS * PIECE)
        whole = LAYERS * PIECE
        return CanonicalKVCaches([CanonicalKVCacheTensor(t, whole)], [[CanonicalKVCacheRef(0, whole)]])
    tensors = [CanonicalKVCacheTensor(t.view(BLOCKS, PIECE), PIECE) for t in data.chunk(LAYERS)]
    return CanonicalKVCaches(tensors, [[CanonicalKVCacheRef(i, PIECE) for i in range(LAYERS)]])


def worker(tmp_path: Path, kv: CanonicalKVCaches) -> TierWorker:
    regions, chunk_bytes = block_regions(kv)
    return TierWorker(regions, HostBlockStore(tmp_path / "tier", 4, chunk_bytes), cuda=False)


def gpu(*blocks: int) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(blocks), group_sizes=[len(blocks)], block_indices=[0])


def block(kv: CanonicalKVCaches, b: int) -> torch.Tensor:
    return torch.cat([t.tensor[b] for t in kv.tensors])


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform", "per-layer"])
def test_a_stored_block_loads_back_bit_exact_into_another_block(tmp_path: Path, uniform: bool) -> None:
    kv = caches(uniform)
    w = worker(tmp_path, kv)
    assert len(w.regions) == (1 if uniform else LAYERS)  # copies per block
    original = block(kv, 3).clone()
    assert w.submit_store(1, gpu(3), CPULoadStoreSpec([2]))
    assert w.submit_load(2, CPULoadStoreSpec([2]), gpu(6))
    results = w.get_finished()
    whole = LAYERS * PIECE
    assert [(r.job_id, r.success, r.transfer_size) for r in results] == [(1, True, whole), (2, True, whole)]
    assert torch.equal(block(kv, 6), original)
    assert w.take_load_errors() == set()
    w.shutdown()


def test_a_failed_store_is_never_served_and_its_blocks_are_recomputed(tmp_path: Path) -> None:
    kv = caches(uniform=True)
    w = worker(tmp_path, kv)
    w.submit_store(1, gpu(2), CPULoadStoreSpec([1]))
    w.submit_store(2, gpu(99), CPULoadStoreSpec([1]))  # block 99 does not exist: the copy fails
    before = block(kv, 5).clone()
    w.submit_load(3, CPULoadStoreSpec([1]), gpu(5))
    assert torch.equal(block(kv, 5), before)  # nothing copied from the poisoned chunk
    assert w.take_load_errors() == {5}  # vLLM recomputes block 5
    assert all(r.success for r in w.get_finished())  # vLLM's offloading worker asserts success
    w.submit_store(4, gpu(2), CPULoadStoreSpec([1]))  # a good store heals the chunk
    w.submit_load(5, CPULoadStoreSpec([1]), gpu(5))
    assert torch.equal(block(kv, 5), block(kv, 2))
    assert w.take_load_errors() == set()
    w.shutdown()
    assert not (tmp_path / "tier").exists()


def test_a_store_file_cut_under_the_worker_loses_every_chunk_but_never_faults_or_serves_zeros(tmp_path: Path) -> None:
    """Truncated from outside (a root shell in the pod): the worker restores the file's size before
    its next copy, so nothing faults; every chunk stored before is poisoned (its bytes are zeros
    now) and loads from it are reported for recomputation; new stores heal their chunks."""
    import os

    kv = caches(uniform=True)
    w = worker(tmp_path, kv)
    w.submit_store(1, gpu(2), CPULoadStoreSpec([1]))
    w.submit_store(2, gpu(3), CPULoadStoreSpec([2]))
    os.truncate(tmp_path / "tier", 0)
    w.submit_store(3, gpu(4), CPULoadStoreSpec([0]))  # into the cut part: no fault
    before = block(kv, 5).clone()
    w.submit_load(4, CPULoadStoreSpec([1, 2]), gpu(5, 6))
    assert torch.equal(block(kv, 5), before)  # nothing loaded from a lost chunk
    assert w.take_load_errors() == {5, 6}
    w.submit_load(5, CPULoadStoreSpec([0]), gpu(7))  # stored after the cut: good
    assert torch.equal(block(kv, 7), block(kv, 4))
    assert w.take_load_errors() == set()
    assert all(r.success for r in w.get_finished())  # vLLM's offloading worker asserts success
    w.shutdown()

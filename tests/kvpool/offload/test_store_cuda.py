"""The tier's store on a GPU host: pinned (cudaHostRegister'ed) shared memory, asynchronous
whole-block copies to and from device memory, bit-exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvpool.offload import HostBlockStore, copy_blocks
from kvpool.offload.store import chunk_layout

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pieces", [1, 32], ids=["uniform", "per-layer"])
def test_pinned_store_round_trips_device_blocks(tmp_path: Path, pieces: int) -> None:
    pool = torch.randint(0, 255, (16 * (2 << 20),), dtype=torch.uint8, device="cuda")
    regions, chunk_bytes = chunk_layout(list(pool.view(pieces, 16, (2 << 20) // pieces)))
    store = HostBlockStore(tmp_path / "tier", num_chunks=4, chunk_bytes=chunk_bytes, pin=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        copy_blocks(regions, store.tensor, [3, 9], [0, 1], to_store=True, non_blocking=True)
        copy_blocks(regions, store.tensor, [12, 13], [1, 0], to_store=False, non_blocking=True)
    stream.synchronize()
    for r in regions:
        assert torch.equal(r.tensor[12], r.tensor[9])
        assert torch.equal(r.tensor[13], r.tensor[3])
    store.close()

"""CUDA backend (GPU only): zero page behind unmapped granules, map/unmap through the reserve,
device memory follows the pool."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.fixture
def backend():  # type: ignore[no-untyped-def]
    from kvpool.vmm.cuda import CudaBackend

    b = CudaBackend(64 * MiB, reserve_granules=2)
    yield b
    b.close()


def test_unmapped_granules_read_zeros_instead_of_faulting(backend) -> None:  # type: ignore[no-untyped-def]
    import torch

    t = backend.as_tensor()
    assert t.is_cuda
    assert t.numel() == backend.size
    assert int(t.sum()) == 0  # every granule is the shared zero page
    torch.cuda.synchronize()


def test_mapped_granules_hold_data_and_come_back_zeroed(backend) -> None:  # type: ignore[no-untyped-def]
    import torch

    g = backend.granularity
    t = backend.as_tensor()
    backend.map(g, 2 * g)
    t[g : 3 * g].fill_(3)
    torch.cuda.synchronize()
    assert int(t[g : 3 * g].float().sum()) == 3 * 2 * g
    assert int(t[:g].sum()) == 0
    backend.unmap(g, 2 * g)
    assert int(t[g : 3 * g].sum()) == 0
    backend.map(g, g)
    assert int(t[g : 2 * g].sum()) == 0
    assert backend.mapped_bytes == g


def test_device_memory_follows_mapping(backend) -> None:  # type: ignore[no-untyped-def]
    import torch

    g = backend.granularity
    free0, _ = torch.cuda.mem_get_info()
    backend.map(0, 16 * g)
    free1, _ = torch.cuda.mem_get_info()
    backend.unmap(0, 16 * g)
    free2, _ = torch.cuda.mem_get_info()
    assert free0 - free1 >= 12 * g  # the reserve may have covered a few granules
    assert free2 - free1 >= 12 * g

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


def test_a_captured_cuda_graph_replays_across_a_shrink_and_a_grow(backend) -> None:  # type: ignore[no-untyped-def]
    """What CUDA graphs in the engine rely on (eager mode is off on GPUs): the pool's virtual
    addresses never move, so a graph captured over pool memory keeps working after the pages
    behind those addresses are unmapped and mapped again (new physical memory, same addresses)."""
    import torch

    g = backend.granularity
    t = backend.as_tensor()
    backend.map(0, 4 * g)
    src, dst = t[g : 2 * g], t[2 * g : 3 * g]
    src.fill_(5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        torch.add(src, 1, out=dst)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.add(src, 1, out=dst)
    graph.replay()
    torch.cuda.synchronize()
    assert int(dst.min()) == int(dst.max()) == 6
    backend.unmap(g, 2 * g)  # shrink: src and dst lose their pages (never replayed meanwhile)
    assert int(t[g : 3 * g].sum()) == 0
    backend.map(g, 2 * g)  # grow: fresh pages at the same addresses
    src.fill_(7)
    graph.replay()
    torch.cuda.synchronize()
    assert int(dst.min()) == int(dst.max()) == 8
    assert int(t[3 * g : 4 * g].sum()) == 0  # the neighbours were not touched
    del graph

"""Backend selection: the host backend opens anywhere; asking for CUDA where there is no driver
is a clear BackendUnavailable, not a crash."""

from __future__ import annotations

import pytest
import torch

from kvpool import BackendKind, BackendUnavailable
from kvpool.vmm import open_backend
from kvpool.vmm.host import HostBackend


def test_the_host_backend_opens_with_the_os_page_as_granularity() -> None:
    backend = open_backend(BackendKind.HOST, 1 << 20)
    try:
        assert isinstance(backend, HostBackend)
        assert (backend.size, backend.granularity, backend.mapped_bytes) == (1 << 20, 4096, 0)
    finally:
        backend.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA; the gpu tests cover it")
def test_the_cuda_backend_without_a_driver_says_so() -> None:
    with pytest.raises(BackendUnavailable, match=r"CUDA|cuda-python"):
        open_backend(BackendKind.CUDA, 1 << 21)

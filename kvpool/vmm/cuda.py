"""CUDA backend: driver-API virtual memory management (cuda-python bindings).

    reserved VA: | zero | real | zero | zero | real | ...     one entry per granule (2 MiB)
                   ^ the same read-write zero handle behind every unmapped granule

* ``cuMemAddressReserve`` once: the address never moves, so CUDA graphs captured over the KV
  cache stay valid across resizes.
* Unmapped granules are not holes: one shared physical "zero page" is mapped behind all of them,
  so padded or stale block ids in a graph replay read zeros instead of faulting the context (as
  kvcached does). It is read-write because attention kernels may write padded slots; those
  writes land in the zero page, whose content is never real data. ``_map_range`` swaps the zero
  mapping for a real handle, ``_unmap_range`` swaps it back.
* ``cuMemCreate`` costs ~200 us per 2 MiB and ``cuMemMap`` ~2 us, so growth takes handles from a
  reserve that a background thread refills off the hot path; released handles go back to it.

Tried and avoided: ``cuMemRelease`` on every unmap (growth then always pays cuMemCreate) and
leaving unmapped granules as holes (an out-of-range block id in a replayed graph kills the
context with an illegal-address error).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from kvpool.errors import BackendUnavailable
from kvpool.vmm.base import VMMBackend

if TYPE_CHECKING:
    import torch

try:  # cuda-python >= 12.6 layout
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - depends on the installed cuda-python
    cu = None


def _ok(result: Any) -> Any:
    """Unwrap a cuda-python ``(CUresult, *values)`` tuple, raising on any error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise BackendUnavailable(f"CUDA driver call failed: {name.decode() if name else err}")
    return values[0] if len(values) == 1 else tuple(values)


class CudaBackend(VMMBackend):
    """Device memory on ``device``, reserved once and backed granule by granule."""

    def __init__(self, size: int, *, device: int = 0, reserve_granules: int = 4) -> None:
        if cu is None:
            raise BackendUnavailable("cuda-python is not installed; install kvpool[cuda]")
        try:
            _ok(cu.cuInit(0))
        except BackendUnavailable:
            raise
        except Exception as e:  # cuda-python raises its own types when libcuda is missing
            raise BackendUnavailable(f"no CUDA driver on this host ({e}); use the host backend") from e
        self._dev = _ok(cu.cuDeviceGet(device))
        self._ctx = _ok(cu.cuDevicePrimaryCtxRetain(self._dev))
        _ok(cu.cuCtxSetCurrent(self._ctx))
        self._device = device
        self._prop = cu.CUmemAllocationProp()
        self._prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self._prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._prop.location.id = device
        flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        gran = int(_ok(cu.cuMemGetAllocationGranularity(self._prop, flag)))
        size = -(-size // gran) * gran
        super().__init__(size, gran)
        self._ptr = int(_ok(cu.cuMemAddressReserve(size, gran, 0, 0)))
        self._access = cu.CUmemAccessDesc()
        self._access.location = self._prop.location
        self._access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._zero = _ok(cu.cuMemCreate(gran, self._prop, 0))
        self._handles: dict[int, Any] = {}  # granule -> real handle
        self._reserve: list[Any] = []
        self._reserve_target = reserve_granules
        self._refill = threading.Event()
        self._stop = False
        for g in range(size // gran):
            _ok(cu.cuMemMap(self._ptr + g * gran, gran, 0, self._zero, 0))
        _ok(cu.cuMemSetAccess(self._ptr, size, [self._access], 1))
        _ok(cu.cuMemsetD8(self._ptr, 0, gran))  # zero the shared page once, through granule 0
        self._filler = threading.Thread(target=self._fill_loop, name="kvpool-cuda-reserve", daemon=True)
        self._filler.start()
        self._refill.set()

    @property
    def reserve_bytes(self) -> int:
        return len(self._reserve) * self.granularity

    def address(self) -> int:
        return self._ptr

    def as_tensor(self) -> torch.Tensor:
        import torch

        iface = _CudaArray(self._ptr, self.size)
        return torch.as_tensor(iface, device=f"cuda:{self._device}")

    def _map_range(self, offset: int, length: int) -> None:
        gran = self.granularity
        done: list[int] = []
        try:
            for g in range(offset // gran, (offset + length) // gran):
                handle = self._take_handle()
                va = self._ptr + g * gran
                _ok(cu.cuMemUnmap(va, gran))
                _ok(cu.cuMemMap(va, gran, 0, handle, 0))
                self._handles[g] = handle
                done.append(g)
            _ok(cu.cuMemSetAccess(self._ptr + offset, length, [self._access], 1))
            _ok(cu.cuMemsetD8(self._ptr + offset, 0, length))
        except BaseException:
            self._swap_to_zero(done)
            raise
        self._refill.set()

    def _unmap_range(self, offset: int, length: int) -> None:
        gran = self.granularity
        _ok(cu.cuCtxSynchronize())  # no kernel may still touch the memory we hand back
        self._swap_to_zero(list(range(offset // gran, (offset + length) // gran)))

    def _swap_to_zero(self, granules: list[int]) -> None:
        gran = self.granularity
        for g in granules:
            va = self._ptr + g * gran
            _ok(cu.cuMemUnmap(va, gran))
            _ok(cu.cuMemMap(va, gran, 0, self._zero, 0))
            _ok(cu.cuMemSetAccess(va, gran, [self._access], 1))
            handle = self._handles.pop(g)
            if len(self._reserve) < self._reserve_target:
                self._reserve.append(handle)
            else:
                _ok(cu.cuMemRelease(handle))

    def _take_handle(self) -> Any:
        try:
            return self._reserve.pop()
        except IndexError:  # reserve ran dry: pay cuMemCreate on the hot path
            return _ok(cu.cuMemCreate(self.granularity, self._prop, 0))

    def _fill_loop(self) -> None:
        _ok(cu.cuCtxSetCurrent(self._ctx))
        while True:
            self._refill.wait()
            self._refill.clear()
            if self._stop:
                return
            while len(self._reserve) < self._reserve_target and not self._stop:
                handle = _ok(cu.cuMemCreate(self.granularity, self._prop, 0))
                with self._lock:  # map()/unmap() hold the same lock while they use the reserve
                    self._reserve.append(handle)

    def _release(self) -> None:
        self._stop = True
        self._refill.set()
        self._filler.join(timeout=5)
        _ok(cu.cuCtxSynchronize())
        self._swap_to_zero(list(self._handles))
        _ok(cu.cuMemUnmap(self._ptr, self.size))
        for handle in [self._zero, *self._reserve]:
            _ok(cu.cuMemRelease(handle))
        self._reserve.clear()
        _ok(cu.cuMemAddressFree(self._ptr, self.size))
        _ok(cu.cuDevicePrimaryCtxRelease(self._dev))


class _CudaArray:
    """Minimal ``__cuda_array_interface__`` exporter so torch wraps the range zero-copy."""

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }

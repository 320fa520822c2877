"""Virtual-memory backends: reserve an address range once, back it with pages on demand.

Only :mod:`kvpool.vmm.cuda` imports CUDA bindings; it is loaded lazily by
:func:`kvpool.vmm.open_backend` so CPU-only hosts never need them.
"""

from __future__ import annotations

from kvpool.vmm.base import BackendKind, VMMBackend


def open_backend(kind: BackendKind, size: int, *, device: int = 0, prefault: bool = True) -> VMMBackend:
    """Reserve ``size`` bytes of address space with the backend ``kind``."""
    if kind is BackendKind.HOST:
        from kvpool.vmm.host import HostBackend

        return HostBackend(size, prefault=prefault)
    from kvpool.vmm.cuda import CudaBackend

    return CudaBackend(size, device=device)


__all__ = ["BackendKind", "VMMBackend", "open_backend"]

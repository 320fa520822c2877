"""Host backend: an anonymous ``mmap`` reservation whose pages are made accessible on demand.

* reserve: ``mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`` -- address space only,
  no commit charge, so a 100 GiB virtual KV cache costs nothing until used;
* map: ``mprotect(READ|WRITE)`` then, when ``prefault``, ``MADV_POPULATE_WRITE`` so the first
  forward pass does not pay page faults (falls back to writing zeros on kernels < 5.14);
* unmap: ``MADV_DONTNEED`` (the kernel frees the pages now, RSS falls, a remap reads zeros) then
  ``mprotect(PROT_NONE)`` so a stray access is a loud SIGSEGV rather than silent corruption.

Tried and avoided: ``munmap`` + ``mmap(MAP_FIXED)`` per page -- it races with any other thread
that maps memory and briefly leaves a hole another allocation can take.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from typing import TYPE_CHECKING

from kvpool.errors import BackendUnavailable
from kvpool.vmm.base import VMMBackend

if TYPE_CHECKING:
    import torch

_PROT_NONE = 0
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = 0x4000  # Linux value; not exported by the mmap module
_MADV_DONTNEED = 4
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    for name in ("mprotect", "madvise", "munmap"):
        fn = getattr(libc, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + ([ctypes.c_int] if name != "munmap" else [])
    return libc


class HostBackend(VMMBackend):
    """Anonymous host memory, reserved once and committed page by page."""

    def __init__(self, size: int, *, prefault: bool = True) -> None:
        super().__init__(size, mmap.PAGESIZE)
        self._prefault = prefault
        self._libc = _libc()
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        addr = self._libc.mmap(None, size, _PROT_NONE, flags, -1, 0)
        if addr is None or addr == _MAP_FAILED:
            raise BackendUnavailable(f"mmap reservation of {size} bytes failed: {_errno()}")
        self._addr: int = addr

    def address(self) -> int:
        return self._addr

    def as_tensor(self) -> torch.Tensor:
        import torch

        buf = (ctypes.c_uint8 * self.size).from_address(self._addr)
        # frombuffer shares memory with ``buf``; keep ``buf`` alive through the tensor's base.
        return torch.frombuffer(buf, dtype=torch.uint8)

    def _map_range(self, offset: int, length: int) -> None:
        addr = self._addr + offset
        if self._libc.mprotect(addr, length, _PROT_RW):
            raise BackendUnavailable(f"mprotect(READ|WRITE) of {length} bytes failed: {_errno()}")
        if self._prefault and self._libc.madvise(addr, length, _MADV_POPULATE_WRITE):
            ctypes.memset(addr, 0, length)  # older kernel: fault the pages in by hand

    def _unmap_range(self, offset: int, length: int) -> None:
        addr = self._addr + offset
        if self._libc.madvise(addr, length, _MADV_DONTNEED):
            raise BackendUnavailable(f"madvise(DONTNEED) of {length} bytes failed: {_errno()}")
        if self._libc.mprotect(addr, length, _PROT_NONE):
            raise BackendUnavailable(f"mprotect(NONE) of {length} bytes failed: {_errno()}")

    def _release(self) -> None:
        self._libc.munmap(self._addr, self.size)


def _errno() -> str:
    err = ctypes.get_errno()
    return f"{os.strerror(err)} (errno {err})"

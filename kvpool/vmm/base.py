"""The one seam between the pool and physical memory.

A backend reserves a contiguous virtual range once (its address never changes, so tensors and
CUDA graphs built over it stay valid) and backs granule-aligned sub-ranges with physical memory
on demand. The base class owns argument checking and the record of which granules are mapped;
subclasses only talk to the OS or the driver.

    offset 0                                                        size
    | granule 0 | granule 1 | granule 2 | ... | granule G-1 |
      mapped      unmapped    mapped                            map(offset, length) works on
                                                                whole granules only
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvpool.errors import ConfigError

if TYPE_CHECKING:
    import torch


class BackendKind(enum.Enum):
    """Which physical memory backs the pool."""

    HOST = "host"  #: anonymous mmap + mprotect/madvise (CPU engines, tests)
    CUDA = "cuda"  #: CUDA virtual memory management (cuMemCreate/cuMemMap)


class VMMBackend(ABC):
    """Reserved virtual range whose granules are mapped and unmapped individually.

    Contract for subclasses:

    * ``_map_range`` / ``_unmap_range`` receive validated, granule-aligned ranges whose granules
      are all unmapped (resp. all mapped). After ``_map_range`` returns the range reads zeros and
      is writable; after ``_unmap_range`` its physical memory is returned (or kept in the
      backend's reserve) and the range must not be written.
    * Either both succeed for the whole range or they raise and leave it as it was.
    """

    def __init__(self, size: int, granularity: int) -> None:
        if granularity <= 0 or granularity & (granularity - 1):
            raise ConfigError(f"backend granularity must be a power of two, got {granularity}")
        if size <= 0 or size % granularity:
            raise ConfigError(
                f"reserved size {size} must be a positive multiple of the backend granularity "
                f"{granularity}; round the pool's virtual capacity up to a whole page"
            )
        self._size = size
        self._granularity = granularity
        self._mapped: set[int] = set()
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """Bytes of reserved virtual address space."""
        return self._size

    @property
    def granularity(self) -> int:
        """Smallest mappable unit in bytes; every page size must be a multiple of it."""
        return self._granularity

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently backed by physical memory and accessible."""
        with self._lock:
            return len(self._mapped) * self._granularity

    @property
    def reserve_bytes(self) -> int:
        """Physical bytes created ahead of demand but not mapped (0 when the backend keeps none)."""
        return 0

    @abstractmethod
    def address(self) -> int:
        """Start address of the reserved range (host or device pointer)."""

    @abstractmethod
    def as_tensor(self) -> torch.Tensor:
        """A zero-copy ``uint8`` tensor over the whole range, on the backend's device."""

    @abstractmethod
    def _map_range(self, offset: int, length: int) -> None:
        """Back ``[offset, offset+length)`` with zeroed physical memory."""

    @abstractmethod
    def _unmap_range(self, offset: int, length: int) -> None:
        """Release the physical memory behind ``[offset, offset+length)``."""

    @abstractmethod
    def _release(self) -> None:
        """Give the whole reservation back to the OS or driver."""

    def map(self, offset: int, length: int) -> None:
        """Back a granule-aligned range; every granule in it must be unmapped."""
        granules = self._granules(offset, length)
        with self._lock:
            busy = [g for g in granules if g in self._mapped]
            if busy:
                raise ConfigError(f"map({offset}, {length}): granule {busy[0]} is already mapped")
            self._map_range(offset, length)
            self._mapped.update(granules)

    def unmap(self, offset: int, length: int) -> None:
        """Release a granule-aligned range; every granule in it must be mapped."""
        granules = self._granules(offset, length)
        with self._lock:
            idle = [g for g in granules if g not in self._mapped]
            if idle:
                raise ConfigError(f"unmap({offset}, {length}): granule {idle[0]} is not mapped")
            self._unmap_range(offset, length)
            self._mapped.difference_update(granules)

    def map_all(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Map several ``(offset, length)`` ranges as one: on failure the ones done are unmapped."""
        done: list[tuple[int, int]] = []
        try:
            for offset, length in ranges:
                self.map(offset, length)
                done.append((offset, length))
        except BaseException:
            for offset, length in done:
                self.unmap(offset, length)
            raise

    def is_mapped(self, offset: int) -> bool:
        """Whether the granule holding byte ``offset`` is backed."""
        with self._lock:
            return offset // self._granularity in self._mapped

    def close(self) -> None:
        """Unmap everything and release the reservation; the backend is unusable afterwards."""
        with self._lock:
            if self._size:
                self._release()
                self._mapped.clear()
                self._size = 0

    def _granules(self, offset: int, length: int) -> range:
        g = self._granularity
        if not self._size:
            raise ConfigError("backend is closed")
        if length <= 0 or offset < 0 or offset % g or length % g or offset + length > self._size:
            raise ConfigError(
                f"range [{offset}, {offset + length}) must be non-empty, aligned to the granularity "
                f"{g} and inside the reservation of {self._size} bytes"
            )
        return range(offset // g, (offset + length) // g)

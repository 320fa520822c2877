"""HostBlockStore: the CPU tier's memory -- a fixed number of chunks in one shared-memory file.

A chunk holds one pool block. The pool's block may be one contiguous region (uniform layout) or
several (per-layer layout: one piece per layer); ``BlockRegion`` says where each piece sits in the
pool and where it goes inside the chunk::

    pool (per-layer, L regions)                       store chunk c (chunk_bytes)
    region 0: [b0][b1][b2] ...   block b piece 0 --->  [ piece 0 | piece 1 | ... | piece L-1 ]
    region 1: [b0][b1][b2] ...   block b piece 1 ---/   ^offset 0  ^offset n0      ^sum(n0..)
    ...
    pool (uniform, 1 region): [b0 all layers][b1 ...]  --->  [ whole block ]  (one copy)

The file lives in ``directory`` (``/dev/shm`` by default, so in Kubernetes the pod needs a
memory-backed ``emptyDir`` at least as large as the tier). It is sized and its memory reserved once,
at start, with ``posix_fallocate``: a directory too small for the tier is a clear error then, where
a sparse file would have died of SIGBUS mid-request on the first write past the tmpfs's room.
A file (rather than anonymous memory) keeps the tier observable from outside the worker process:
its size shows in ``df /dev/shm``, and tests can inspect or corrupt a stored block.

Someone may cut the file under the worker (a root shell in the pod: ``truncate``). A copy into the
cut part would die of SIGBUS, and what was stored before reads back as zeros. So the store keeps
its fd and the worker asks :meth:`HostBlockStore.restore_if_cut` before every copy (one ``fstat``):
a cut file gets its size and memory back at once (later copies cannot fault) and the caller is
told that every chunk's contents are gone. A cut *between* that check and the copy still faults:
the window is one copy long. Deleting the file changes nothing (the mapping keeps the memory).

A killed worker cannot remove its file, and in a pod the memory-backed ``/dev/shm`` outlives a
container restart. The live store holds an exclusive ``flock`` on its file for its whole life, so
:func:`reap_stale` removes exactly the files nobody holds. (Not the owner's pid in the name: a
restarted container starts its processes with the same pids, so a dead owner's pid is often alive
again -- it may even be the new worker's own, whose file name then collides.) Creating and reaping
hold the directory's lock, so no file is reaped between its creation and its owner's lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kvpool.errors import ConfigError


class StoreDamaged(RuntimeError):
    """The store's file was cut and its size could not be restored: no chunk may be touched."""


@dataclass(frozen=True)
class BlockRegion:
    """One piece of every block: ``tensor[b]`` is block b's piece (``nbytes`` long), stored at
    ``offset`` inside each chunk."""

    tensor: torch.Tensor  #: (num_blocks, nbytes), one byte per element
    offset: int

    @property
    def nbytes(self) -> int:
        return int(self.tensor.shape[1])


def chunk_layout(pieces: Sequence[torch.Tensor]) -> tuple[list[BlockRegion], int]:
    """Pack the pieces of a block one after another in a chunk; return the regions and chunk size."""
    regions, offset = [], 0
    for t in pieces:
        if t.dim() != 2 or t.element_size() != 1:
            raise ConfigError(f"a block region must be a 2-D byte tensor, got {tuple(t.shape)} {t.dtype}")
        regions.append(BlockRegion(t, offset))
        offset += int(t.shape[1])
    return regions, offset


class HostBlockStore:
    """``num_chunks`` chunks of ``chunk_bytes`` in a shared-memory file; ``pin`` registers the
    mapping with CUDA so copies to and from the GPU are asynchronous DMA."""

    def __init__(self, path: Path, num_chunks: int, chunk_bytes: int, pin: bool = False) -> None:
        if num_chunks <= 0 or chunk_bytes <= 0:
            raise ConfigError(f"the CPU tier needs at least one chunk ({num_chunks} x {chunk_bytes} bytes)")
        self.path, self.num_chunks, self.chunk_bytes = path, num_chunks, chunk_bytes
        size = num_chunks * chunk_bytes
        with _directory_lock(path.parent):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "alive" for reap_stale, until the fd closes
        try:
            _reserve(fd, path, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ConfigError):
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd = fd  # kept: restore_if_cut() sees the file's size even once its name is gone
        self._broken = False
        flat = torch.frombuffer(self._map, dtype=torch.uint8)
        self.tensor = flat.view(num_chunks, chunk_bytes)
        self._pinned = False
        if pin:
            rc = torch.cuda.cudart().cudaHostRegister(flat.data_ptr(), size, 0)  # type: ignore[no-untyped-call]
            if rc.value != 0:
                self.close()
                raise ConfigError(f"cudaHostRegister of the {size}-byte CPU tier failed ({rc})")
            self._pinned = True

    @property
    def capacity_bytes(self) -> int:
        return self.num_chunks * self.chunk_bytes

    def restore_if_cut(self) -> bool:
        """True if the file was cut below its size since the last call: its size and memory are
        restored (the cut part reads as zeros), and every chunk's contents must be treated as lost.
        Raises :class:`StoreDamaged` if the room to restore it is gone (then and for ever after)."""
        if self._broken:
            raise StoreDamaged(f"the CPU tier's file {self.path} was cut and could not be restored")
        if os.fstat(self._fd).st_size >= self.capacity_bytes:
            return False
        try:
            os.ftruncate(self._fd, self.capacity_bytes)
            _reserve(self._fd, self.path, self.capacity_bytes)
        except (OSError, ConfigError) as e:
            self._broken = True
            raise StoreDamaged(f"the CPU tier's file {self.path} was cut and could not be restored: {e}") from e
        return True

    def close(self) -> None:
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())  # type: ignore[no-untyped-call]
            self._pinned = False
        del self.tensor
        with contextlib.suppress(BufferError):  # a view is still alive somewhere; the file goes anyway
            self._map.close()
        os.close(self._fd)
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


TIER_FILES = "kvpool-tier-*"  #: the names of the CPU tier's store files (the worker names them)


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True  # gone already: nothing to reap
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases a lock it took
    return False


def stale_files(directory: Path, pattern: str = TIER_FILES) -> list[Path]:
    """The files matching ``pattern`` in ``directory`` whose store is gone (nobody holds their lock)."""
    return [path for path in sorted(directory.glob(pattern)) if not _held(path)]


def reap_stale(directory: Path, pattern: str = TIER_FILES) -> list[Path]:
    """Remove :func:`stale_files`; a live store's file is kept. Returns what was removed."""
    with _directory_lock(directory):
        stale = stale_files(directory, pattern)
        for path in stale:
            path.unlink(missing_ok=True)
    return stale


def _reserve(fd: int, path: Path, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EFBIG):
            raise
        free = shutil.disk_usage(path.parent).free
        raise ConfigError(
            f"the CPU tier needs {size} bytes in {path.parent} but only {free} are free: lower --offload-bytes "
            "or give --offload-dir more room (in Kubernetes: the pod's /dev/shm emptyDir sizeLimit)"
        ) from e


def copy_blocks(
    regions: Sequence[BlockRegion],
    store: torch.Tensor,
    blocks: Sequence[int],
    chunks: Sequence[int],
    to_store: bool,
    non_blocking: bool = False,
) -> int:
    """Copy whole blocks between the pool and the store: one copy per block and region (so one
    per block in the uniform layout). Returns the bytes moved."""
    if len(blocks) != len(chunks):
        raise ValueError(f"{len(blocks)} blocks but {len(chunks)} chunks")
    moved = 0
    for r in regions:
        lo, hi = r.offset, r.offset + r.nbytes
        for b, c in zip(blocks, chunks, strict=True):
            if to_store:
                store[c, lo:hi].copy_(r.tensor[b], non_blocking=non_blocking)
            else:
                r.tensor[b].copy_(store[c, lo:hi], non_blocking=non_blocking)
        moved += r.nbytes * len(blocks)
    return moved

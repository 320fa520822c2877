"""Worker half of the connector: the KV cache lives in a VMM reservation; pages follow commands.

vLLM allocates the whole KV cache with one ``torch.zeros(size, dtype=int8)`` inside the
connector's ``get_mem_pool_context()``. A TorchFunctionMode answers that one call with a tensor
over the pool's reserved range instead, so vLLM's views (and CUDA graphs) point into memory that
is backed page by page. Only page 0 (vLLM's null block) and the initially mapped pages are backed
at start; everything else follows the scheduler's commands, applied in
``bind_connector_metadata`` -- before the step's forward pass reads or writes any block.

Tried and avoided: wrapping vLLM's allocator function (private, moves between releases) and
``torch.cuda.MemPool`` (it cannot hand out memory that is not yet backed).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kvpool.errors import ConfigError, KVPoolError, PoolExhausted
from kvpool.layout import Geometry, PageId
from kvpool.ledger import Ledger
from kvpool.vllm.engine.protocol import PageCommand, PageOp, PoolMetadata, PoolWorkerMetadata
from kvpool.vllm.engine.settings import ConnectorSettings
from kvpool.vmm import VMMBackend, open_backend

log = logging.getLogger(__name__)
#: the pool retries a refused map every step while demand lasts; one line per this many seconds
LEDGER_LOG_EVERY_S = 30


class _AllocateFromPool(TorchFunctionMode):
    """Turn the KV cache's single ``torch.zeros(size, int8)`` into a view of the pool."""

    def __init__(self, size: int, provide: Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self._size, self._provide, self.used = size, provide, False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.zeros and not self.used and kwargs.get("dtype") is torch.int8:
            size = args[0] if len(args) == 1 else args
            if isinstance(size, int) and size >= self._size:
                self.used = True
                return self._provide()[:size].view(torch.int8)
        return func(*args, **kwargs)


class WorkerSide:
    """One rank's pool: a reserved range, the pages the scheduler asked for, and their acks."""

    def __init__(self, settings: ConnectorSettings, geometry: Geometry, device: int = 0) -> None:
        self.settings, self.geometry = settings, geometry
        gran_size = -(-geometry.total_bytes // (2 << 20)) * (2 << 20)  # whole 2 MiB: fits both backends
        self.backend: VMMBackend = open_backend(settings.backend, gran_size, device=device)
        self._mode = _AllocateFromPool(geometry.total_bytes, self._buffer)
        self._done: set[int] = set()
        self._failed: dict[int, str] = {}
        self._mapped: set[PageId] = set()
        self._refused_logged = float("-inf")
        # every map debits the node ledger first and every unmap credits it (kvpool.ledger)
        self._ledger = (
            Ledger(f"{settings.ledger_path}-dev{device}", f"{settings.model}:{os.getpid()}", settings.ledger_bytes)
            if settings.ledger_bytes
            else None
        )
        self._apply_map(PageId(0))  # the null block, which vLLM may touch before any command

    def allocation_context(self) -> AbstractContextManager[Any]:
        return self._mode

    def _buffer(self) -> torch.Tensor:
        return self.backend.as_tensor()

    def check_views(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Every layer view vLLM registered must point into our range (else vLLM allocated elsewhere)."""
        if not self._mode.used:
            raise ConfigError("vLLM did not allocate its KV cache inside kvpool's allocation context")
        lo, hi = self.backend.address(), self.backend.address() + self.backend.size
        outside = [name for name, t in kv_caches.items() if not lo <= t.data_ptr() < hi]
        if outside:
            raise ConfigError(f"KV cache layers {outside[:3]} are not in kvpool's range")

    def apply(self, metadata: PoolMetadata) -> None:
        """Apply the step's commands in order; record each as done or failed."""
        for cmd in metadata.commands:
            try:
                self._apply(cmd)
                self._done.add(cmd.seq)
            except PoolExhausted as e:  # the node ledger is spent: expected while others hold it
                if time.monotonic() - self._refused_logged > LEDGER_LOG_EVERY_S:
                    self._refused_logged = time.monotonic()
                    log.warning("kvpool: map of page %d refused (repeats are logged every %d s): %s",
                                cmd.page, LEDGER_LOG_EVERY_S, e)  # fmt: skip
                self._failed[cmd.seq] = str(e)
            except (KVPoolError, OSError) as e:
                log.error("kvpool: %s of page %d failed: %s", cmd.op.value, cmd.page, e)
                self._failed[cmd.seq] = str(e)

    def _apply(self, cmd: PageCommand) -> None:
        page = PageId(cmd.page)
        if cmd.op is PageOp.MAP:
            self._apply_map(page)
        elif page in self._mapped:
            for r in self.geometry.page_ranges(page):
                self.backend.unmap(r.offset, r.length)
            self._mapped.discard(page)
            if self._ledger:
                self._ledger.credit(self.geometry.page_physical_bytes)

    def _apply_map(self, page: PageId) -> None:
        if page in self._mapped:
            return
        if self._ledger:
            self._ledger.debit(self.geometry.page_physical_bytes)  # PoolExhausted: refused, reported as a failed map
        try:
            self.backend.map_all(self.geometry.page_ranges(page))
        except BaseException:
            if self._ledger:
                self._ledger.credit(self.geometry.page_physical_bytes)
            raise
        self._mapped.add(page)

    def take_results(self) -> PoolWorkerMetadata | None:
        if not self._done and not self._failed:
            return None
        out = PoolWorkerMetadata(frozenset(self._done), dict(self._failed))
        self._done.clear()
        self._failed.clear()
        return out

    @property
    def mapped_bytes(self) -> int:
        return self.backend.mapped_bytes

    def close(self) -> None:
        self.backend.close()
        if self._ledger:
            self._ledger.close()

"""PoolConfig: every setting of one pool, frozen and validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import ConfigError
from kvpool.layout import KVLayout, ModelShape
from kvpool.vmm.base import BackendKind

MiB = 1 << 20


@dataclass(frozen=True)
class PoolConfig:
    """How one model's KV pool is shaped, backed and limited."""

    shape: ModelShape
    """The model's attention shape (per worker rank)."""
    virtual_bytes: int
    """Address space to reserve; vLLM is told the block count that fits (rounded down to pages)."""
    limit_bytes: int
    """Physical memory the pool may back at start; changed later with ``resize``."""
    layout: KVLayout = KVLayout.UNIFORM
    """``UNIFORM`` (BLNHC) on GPUs; ``PER_LAYER`` (LBHNC) where the attention needs it (CPU)."""
    backend: BackendKind = BackendKind.HOST
    """Physical memory: ``HOST`` (mmap) or ``CUDA`` (VMM driver API)."""
    page_bytes: int = 2 * MiB
    """Mapping granule; a multiple of the backend granularity (4 KiB host, 2 MiB CUDA)."""
    reserve_pages: int = 1
    """Pages kept backed but idle so growth needs no syscall on the hot path."""
    model: str = "default"
    """Name reported in snapshots and metric labels."""
    prefault: bool = True
    """Host backend: populate pages when mapping so the forward pass takes no page faults."""
    device: int = 0
    """CUDA device ordinal (CUDA backend only)."""

    def __post_init__(self) -> None:
        if self.virtual_bytes <= 0:
            raise ConfigError(f"virtual_bytes must be > 0, got {self.virtual_bytes}")
        if not 0 <= self.limit_bytes <= self.virtual_bytes:
            raise ConfigError(
                f"limit_bytes={self.limit_bytes} must be between 0 and virtual_bytes={self.virtual_bytes}"
            )
        if self.page_bytes <= 0 or self.page_bytes % 4096:
            raise ConfigError(f"page_bytes={self.page_bytes} must be a positive multiple of 4096")
        if self.reserve_pages < 0:
            raise ConfigError(f"reserve_pages must be >= 0, got {self.reserve_pages}")
        if not self.model:
            raise ConfigError("model must be a non-empty name")

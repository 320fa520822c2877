"""kvpool: an elastic, VMM-backed KV-cache pool with a uniform cross-layer layout.

Public API (``server`` imports only these names; ``operator`` none of kvpool)::

    PoolConfig, ModelShape, KVLayout, Geometry      -- what a pool looks like
    KVPool, Allocation, ResizeResult, TrimResult    -- the pool itself
    PoolSnapshot, ResizeStatus, SCHEMA_VERSION      -- what it reports
    ConfigError, PoolExhausted, BackendUnavailable  -- what can go wrong
"""

from kvpool.config import PoolConfig
from kvpool.errors import BackendUnavailable, ConfigError, KVPoolError, PoolExhausted
from kvpool.layout import BlockId, ByteRange, Geometry, KVLayout, ModelShape, PageId
from kvpool.pool import Allocation, KVPool
from kvpool.snapshot import (
    SCHEMA_VERSION,
    DemandStats,
    OffloadStats,
    PendingResize,
    PoolSnapshot,
    ResizeResult,
    ResizeStatus,
    TrimResult,
)
from kvpool.vmm import BackendKind

__all__ = [
    "SCHEMA_VERSION",
    "Allocation",
    "BackendKind",
    "BackendUnavailable",
    "BlockId",
    "ByteRange",
    "ConfigError",
    "DemandStats",
    "Geometry",
    "KVLayout",
    "KVPool",
    "KVPoolError",
    "ModelShape",
    "OffloadStats",
    "PageId",
    "PendingResize",
    "PoolConfig",
    "PoolExhausted",
    "PoolSnapshot",
    "ResizeResult",
    "ResizeStatus",
    "TrimResult",
]

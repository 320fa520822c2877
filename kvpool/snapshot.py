"""The pool's state as data: one frozen snapshot feeds the admin API and the metrics.

``schema_version`` changes whenever a field is renamed or removed (adding one is compatible).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


class ResizeStatus(enum.Enum):
    """Outcome of ``resize(limit, revision)``."""

    APPLIED = "applied"  #: physical memory is within the new limit
    DEFERRED = "deferred"  #: limit set; pages still hold used blocks and are released as they free
    STALE = "stale"  #: an older revision than the pool's; nothing changed
    CONFLICT = "conflict"  #: the pool's revision with a different limit; nothing changed


@dataclass(frozen=True)
class PendingResize:
    """The latest accepted resize and how far it got."""

    target_bytes: int
    revision: int
    status: ResizeStatus


@dataclass(frozen=True)
class OffloadStats:
    """CPU offload tier counters (absent when the tier is off)."""

    capacity_bytes: int
    used_bytes: int
    hits: int
    misses: int
    bytes_in: int  #: host -> pool (loads)
    bytes_out: int  #: pool -> host (stores and demotions)
    demoted_blocks: int


@dataclass(frozen=True)
class DemandStats:
    """Load signals from the engine that the operator's policy weighs."""

    running_requests: int
    waiting_requests: int
    preemptions: int


@dataclass(frozen=True)
class PoolSnapshot:
    """Everything a reader may know about one pool, taken under its lock."""

    model: str
    layout: str
    page_bytes: int  #: physical bytes of one pool page (all its ranges)
    block_bytes: int  #: one block, all layers
    blocks_per_page: int
    virtual_bytes: int
    limit_bytes: int  #: effective limit: whole pages
    mapped_bytes: int  #: pages holding blocks
    reserve_bytes: int  #: backed but not handed out (pool reserve + backend reserve)
    used_blocks: int
    cached_blocks: int
    free_blocks: int  #: free blocks in mapped pages
    pending: PendingResize
    resizes: dict[str, int] = field(default_factory=dict)  #: count by ResizeStatus value
    offload: OffloadStats | None = None
    demand: DemandStats | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (enums as their values)."""
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value

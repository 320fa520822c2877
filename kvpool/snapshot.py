"""The pool's state and results as data: the one contract from the pool to the operator.

Every pool (the standalone ``KVPool`` and the engine's ``SchedulerSide``) returns these types;
the control channel carries them as ``to_dict()`` JSON and rebuilds them with ``from_dict``; the
server's admin API returns that JSON (its shape: ``docs/api.md``, checked by a test against
``docs/api/*.schema.json``); the metrics read the types. ``schema_version`` changes whenever a
field is renamed or removed (adding one is compatible), and readers refuse a version they do not
know.

Bytes, one meaning per name: ``mapped_bytes`` are pages holding blocks; ``reserve_bytes`` are
pages backed but holding none (the pool's reserve and pages awaiting their unmap); their sum,
``physical_bytes``, is what the pool holds of the device and what a budget must count.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from kvpool.errors import ConfigError

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
    finished_requests: int = 0  #: a counter: a load that left stops finishing requests


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
    shrink_preemptions: int = 0
    """Requests the engine preempted to finish a deferred shrink (``preempt_after_s``); vLLM counts
    them in ``demand.preemptions`` too, so a reader can tell them from a lack of memory."""
    schema_version: int = SCHEMA_VERSION

    DERIVED: ClassVar[tuple[str, ...]] = ("physical_bytes",)  #: in to_dict(), not fields

    @property
    def physical_bytes(self) -> int:
        """Device memory the pool holds now: pages with blocks and backed pages without."""
        return self.mapped_bytes + self.reserve_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (enums as their values; ``physical_bytes`` included for readers)."""
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        out["physical_bytes"] = self.physical_bytes
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """The snapshot back from ``to_dict`` JSON; a ConfigError for another schema version."""
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(
                f"snapshot schema_version {d.get('schema_version')!r}: this reader knows {SCHEMA_VERSION}"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        p = d["pending"]
        kw["pending"] = PendingResize(p["target_bytes"], p["revision"], ResizeStatus(p["status"]))
        kw["offload"] = OffloadStats(**d["offload"]) if d.get("offload") else None
        kw["demand"] = DemandStats(**d["demand"]) if d.get("demand") else None
        return cls(**kw)


@dataclass(frozen=True)
class ResizeResult:
    """What ``resize(limit, revision)`` did, right after the call."""

    status: ResizeStatus
    revision: int  #: the pool's revision after the call (unchanged for stale / conflict)
    effective_limit_bytes: int  #: the limit in whole pages
    physical_bytes: int  #: mapped + reserve: what the pool still holds of the device

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        return cls(ResizeStatus(d["status"]), d["revision"], d["effective_limit_bytes"], d["physical_bytes"])


@dataclass(frozen=True)
class TrimResult:
    """What ``trim()`` released: at once in the standalone pool; in the engine the pages drain
    (their blocks leave vLLM's free queue) and are unmapped once every worker acknowledges."""

    released_pages: int
    released_bytes: int
    evicted_blocks: int  #: cached blocks whose content was dropped

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        return cls(d["released_pages"], d["released_bytes"], d["evicted_blocks"])


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value

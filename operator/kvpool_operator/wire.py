"""What the operator reads of the admin API, typed (the operator imports nothing of kvpool; the
JSON shapes are written down in ``docs/api.md`` and ``docs/api/*.schema.json``, and a contract
test checks every key read here against them).

A snapshot of another ``schema_version`` is refused: the operator would rather mark the group
Degraded than move memory on fields whose meaning changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
RESIZE_STATUSES = ("applied", "deferred", "stale", "conflict")


class WireError(ValueError):
    """A reply the operator cannot read: another schema version, or a key missing."""


@dataclass(frozen=True)
class PoolState:
    """One pool, as ``GET /kvpool`` reports it."""

    limit_bytes: int
    mapped_bytes: int  #: pages holding blocks
    physical_bytes: int  #: mapped + reserve (incl. pages awaiting unmap): what counts against a budget
    used_bytes: int  #: used blocks x block bytes
    revision: int  #: of the latest accepted resize
    status: str  #: of that resize: applied | deferred
    running_requests: int = 0
    waiting_requests: int = 0
    preemptions: int = 0  #: for lack of memory: vLLM's count less the pool's own, for shrinks
    page_bytes: int = 1  #: the pool holds its limit in whole pages (rounds a limit down to one)
    finished_requests: int = 0  #: a counter

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PoolState:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise WireError(
                f"snapshot schema_version {d.get('schema_version')!r}; this operator reads {SCHEMA_VERSION}"
            )
        try:
            demand, pending = d.get("demand") or {}, d["pending"]
            # the pool's own preemptions, for a shrink, are not a lack of memory
            preemptions = int(demand.get("preemptions", 0)) - int(d.get("shrink_preemptions", 0))
            return cls(
                limit_bytes=int(d["limit_bytes"]), mapped_bytes=int(d["mapped_bytes"]),
                physical_bytes=int(d["physical_bytes"]), used_bytes=int(d["used_blocks"]) * int(d["block_bytes"]),
                revision=int(pending["revision"]), status=str(pending["status"]),
                running_requests=int(demand.get("running_requests", 0)),
                waiting_requests=int(demand.get("waiting_requests", 0)), preemptions=preemptions,
                page_bytes=max(1, int(d["page_bytes"])),
                finished_requests=int(demand.get("finished_requests", 0)),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise WireError(f"snapshot without a readable {e}") from e


@dataclass(frozen=True)
class ResizeReply:
    """``PUT /kvpool/limit``'s answer."""

    status: str  #: one of RESIZE_STATUSES
    revision: int
    effective_limit_bytes: int
    physical_bytes: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ResizeReply:
        try:
            out = cls(str(d["status"]), int(d["revision"]), int(d["effective_limit_bytes"]), int(d["physical_bytes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise WireError(f"resize reply without a readable {e}") from e
        if out.status not in RESIZE_STATUSES:
            raise WireError(f"resize status {out.status!r} is none of {RESIZE_STATUSES}")
        return out


#: every key path this module reads, for the contract test against the published schemas
READS = {
    "snapshot": ["schema_version", "limit_bytes", "mapped_bytes", "physical_bytes", "used_blocks", "block_bytes",
                 "pending.revision", "pending.status", "demand.running_requests", "demand.waiting_requests",
                 "demand.preemptions", "shrink_preemptions"],
    "resize": ["status", "revision", "effective_limit_bytes", "physical_bytes"],
}  # fmt: skip

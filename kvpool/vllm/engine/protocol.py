"""What travels between the scheduler half and the worker halves of the connector, per step.

    scheduler (engine core)                         worker rank r (same or other process)
    build_connector_meta --PoolMetadata(commands)--> bind_connector_metadata: apply, in order,
                                                     before the forward pass
    update_connector_output <--PoolWorkerMetadata--- build_connector_worker_meta
                                (done & failed; ranks aggregated: done = intersection)

Commands are idempotent on the worker (mapping a mapped page is a no-op), so a command that
failed on one rank can be undone on all of them with the opposite command.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata


class PageOp(enum.Enum):
    MAP = "map"
    UNMAP = "unmap"


@dataclass(frozen=True)
class PageCommand:
    seq: int  #: monotonic per engine; identifies the command in acknowledgements
    page: int
    op: PageOp


@dataclass
class PoolMetadata(KVConnectorMetadata):
    commands: list[PageCommand] = field(default_factory=list)
    tier: KVConnectorMetadata | None = None  #: the CPU tier's own metadata, when it is on


@dataclass
class PoolWorkerMetadata(KVConnectorWorkerMetadata):
    done: frozenset[int] = frozenset()
    failed: dict[int, str] = field(default_factory=dict)
    tier: KVConnectorWorkerMetadata | None = None

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, PoolWorkerMetadata):
            return self
        tier = self.tier.aggregate(other.tier) if self.tier and other.tier else self.tier or other.tier
        return PoolWorkerMetadata(self.done & other.done, {**self.failed, **other.failed}, tier)

"""The limit's revision rules, argument checks and state (``Limit``), shared by every pool (pure).

Revisions are monotonic per pool so that a controller that retries, or two that race, can never
move a limit backwards:

    incoming revision  <  current  -> STALE     nothing changes
    incoming revision  == current  -> REPEAT    same limit: report the current status again
                                      CONFLICT  another limit: nothing changes
    incoming revision  >  current  -> NEW       the limit is taken
"""

from __future__ import annotations

import collections
import enum
from typing import Any

from kvpool.errors import ConfigError
from kvpool.layout import Geometry
from kvpool.snapshot import PendingResize, PoolSnapshot, ResizeResult, ResizeStatus


class Verdict(enum.Enum):
    STALE = "stale"
    CONFLICT = "conflict"
    REPEAT = "repeat"
    NEW = "new"


def classify(current_revision: int, current_limit: int, limit_bytes: int, revision: int) -> Verdict:
    """How a ``resize(limit_bytes, revision)`` relates to the pool's current one."""
    if revision < current_revision:
        return Verdict.STALE
    if revision == current_revision:
        return Verdict.REPEAT if limit_bytes == current_limit else Verdict.CONFLICT
    return Verdict.NEW


def check_resize_args(limit_bytes: object, revision: object, floor: int, ceiling: int) -> None:
    """Raise ConfigError naming the argument unless both are integers in range."""
    for name, v in (("limit_bytes", limit_bytes), ("revision", revision)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{name} must be an integer, got {type(v).__name__}")
    assert isinstance(limit_bytes, int)  # for the type checker
    assert isinstance(revision, int)
    if not floor <= limit_bytes <= ceiling:
        raise ConfigError(
            f"limit_bytes={limit_bytes} must be between {floor} (one page) and the virtual size {ceiling}"
        )
    if revision < 0:
        raise ConfigError(f"revision must be >= 0, got {revision}")


class Limit:
    """The limit state of one pool, the same for the standalone ``KVPool`` and the engine's
    ``SchedulerSide``: the requested bytes, the limit in whole pages, the latest accepted resize
    (``pending``) and the count of resize outcomes. The pool owns its pages and how it releases
    them; it tells ``settle`` how many it still holds physically.

        request(limit, revision) -> Verdict   (NEW: pages set, pending DEFERRED until settled)
        settle(physical_pages)                 pending DEFERRED -> APPLIED once within the limit
        accepted()                             count the new request's outcome, once it is known
        result(physical_pages)                 the ResizeResult of the call
    """

    def __init__(self, limit_bytes: int, page_bytes: int, ceiling_bytes: int, floor_pages: int) -> None:
        self.page_bytes, self.ceiling_bytes, self.floor_pages = page_bytes, ceiling_bytes, floor_pages
        self.requested = limit_bytes
        self.pages = self.pages_for(limit_bytes)
        self.pending = PendingResize(self.effective_bytes, 0, ResizeStatus.APPLIED)
        self.counts: collections.Counter[str] = collections.Counter()

    @property
    def effective_bytes(self) -> int:
        return self.pages * self.page_bytes

    def pages_for(self, limit_bytes: int) -> int:
        return max(self.floor_pages, limit_bytes // self.page_bytes)

    def request(self, limit_bytes: int, revision: int) -> Verdict:
        """Check and classify a resize; a NEW one takes the limit (nothing else is touched)."""
        check_resize_args(limit_bytes, revision, self.floor_pages * self.page_bytes, self.ceiling_bytes)
        verdict = classify(self.pending.revision, self.requested, limit_bytes, revision)
        if verdict in (Verdict.STALE, Verdict.CONFLICT):
            self.counts[verdict.value] += 1
        elif verdict is Verdict.NEW:
            self.requested, self.pages = limit_bytes, self.pages_for(limit_bytes)
            self.pending = PendingResize(self.effective_bytes, revision, ResizeStatus.DEFERRED)
        return verdict

    def settle(self, physical_pages: int) -> ResizeStatus:
        if self.pending.status is ResizeStatus.DEFERRED and physical_pages <= self.pages:
            self.pending = PendingResize(self.pending.target_bytes, self.pending.revision, ResizeStatus.APPLIED)
        return self.pending.status

    def accepted(self) -> None:
        self.counts[self.pending.status.value] += 1

    def result(self, verdict: Verdict, physical_pages: int) -> ResizeResult:
        status = ResizeStatus(verdict.value) if verdict in (Verdict.STALE, Verdict.CONFLICT) else self.pending.status
        return ResizeResult(status, self.pending.revision, self.effective_bytes, physical_pages * self.page_bytes)

    def snapshot(self, geometry: Geometry, model: str, mapped_pages: int, **counts: Any) -> PoolSnapshot:
        """A PoolSnapshot -- one builder for both pools: the limit's and the geometry's fields from
        here, the page and block counts (and the tier) from the pool."""
        page = geometry.page_physical_bytes
        return PoolSnapshot(
            model=model, layout=geometry.layout.value, page_bytes=page, block_bytes=geometry.shape.block_bytes,
            blocks_per_page=geometry.blocks_per_page, virtual_bytes=geometry.total_bytes,
            limit_bytes=self.effective_bytes, mapped_bytes=mapped_pages * page, pending=self.pending,
            resizes=dict(self.counts), **counts,
        )  # fmt: skip

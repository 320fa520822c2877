"""The limit's revision rules and argument checks, shared by every pool (pure).

Revisions are monotonic per pool so that a controller that retries, or two that race, can never
move a limit backwards:

    incoming revision  <  current  -> STALE     nothing changes
    incoming revision  == current  -> REPEAT    same limit: report the current status again
                                      CONFLICT  another limit: nothing changes
    incoming revision  >  current  -> NEW       the limit is taken
"""

from __future__ import annotations

import enum

from kvpool.errors import ConfigError


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

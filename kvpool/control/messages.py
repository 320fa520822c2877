"""The control channel's messages: one frozen dataclass per operation, dispatched by type; the
replies are the pools' own result types; errors cross as a closed set of kinds.

    request  {"op": "resize", "args": {"limit_bytes": N, "revision": R}}
    reply    {"ok": true, "result": <the reply type's to_dict()>}
             {"ok": false, "kind": "config" | "integrity" | "timeout" | "internal", "error": "..."}

=========  ==========================  ======================================================
op         reply                       error kinds
=========  ==========================  ======================================================
Snapshot   PoolSnapshot                timeout, internal
Resize     ResizeResult                config (limit or revision refused), timeout, internal
Trim       TrimResult                  timeout, internal
Check      None (``check_integrity``)  integrity (an invariant broke: the numbers), timeout
=========  ==========================  ======================================================
"""

from __future__ import annotations

import dataclasses
import enum
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvpool.errors import ConfigError, KVPoolError
from kvpool.snapshot import PoolSnapshot, ResizeResult, TrimResult


@dataclass(frozen=True)
class Snapshot:
    name: ClassVar[str] = "snapshot"


@dataclass(frozen=True)
class Resize:
    name: ClassVar[str] = "resize"
    limit_bytes: int
    revision: int

    def __post_init__(self) -> None:
        for f in ("limit_bytes", "revision"):  # the JSON may carry anything
            if not isinstance(getattr(self, f), int) or isinstance(getattr(self, f), bool):
                raise ConfigError(f"resize {f} must be an integer, not {getattr(self, f)!r}")


@dataclass(frozen=True)
class Trim:
    name: ClassVar[str] = "trim"


@dataclass(frozen=True)
class Check:
    name: ClassVar[str] = "check"


ControlOp = Snapshot | Resize | Trim | Check
OPS: dict[str, type[ControlOp]] = {op.name: op for op in (Snapshot, Resize, Trim, Check)}
Reply = PoolSnapshot | ResizeResult | TrimResult | None


class ErrorKind(enum.Enum):
    CONFIG = "config"  #: a value the pool refuses (HTTP 400)
    INTEGRITY = "integrity"  #: check_integrity found a broken invariant (HTTP 500)
    TIMEOUT = "timeout"  #: the engine did not serve the request in time (HTTP 503)
    INTERNAL = "internal"  #: anything else the engine raised (HTTP 500)


class IntegrityFailure(KVPoolError):
    """The engine's pool failed its integrity check; the message has the numbers."""


@dataclass
class ControlRequest:
    """One operation on its way to the engine thread, with the future its reply goes to."""

    op: ControlOp
    reply: Future[Reply] = field(default_factory=Future)


def encode_op(op: ControlOp) -> dict[str, Any]:
    return {"op": op.name, "args": dataclasses.asdict(op)}


def decode_op(msg: Any) -> ControlOp:
    """The operation of one request line; a ConfigError names what is wrong with it."""
    if not isinstance(msg, dict) or msg.get("op") not in OPS:
        raise ConfigError(f"control request needs 'op' in {sorted(OPS)}, got {msg!r:.200}")
    args = msg.get("args") or {}
    try:
        return OPS[msg["op"]](**args)
    except TypeError as e:
        raise ConfigError(f"control request {msg['op']!r}: {e}") from e


def encode_reply(result: Reply) -> Any:
    return None if result is None else result.to_dict()


def decode_reply(op: ControlOp, raw: Any) -> Reply:
    match op:
        case Snapshot():
            return PoolSnapshot.from_dict(raw)
        case Resize():
            return ResizeResult.from_dict(raw)
        case Trim():
            return TrimResult.from_dict(raw)
        case Check():
            return None


def error_kind(e: BaseException) -> ErrorKind:
    if isinstance(e, ConfigError):
        return ErrorKind.CONFIG
    if isinstance(e, AssertionError | IntegrityFailure):  # the integrity checks assert
        return ErrorKind.INTEGRITY
    return ErrorKind.INTERNAL

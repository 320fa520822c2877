"""Ledger: one physical budget shared by every pool of a pod, enforced at every map.

The operator keeps the sum of the pools' limits within the group's budget, but limits are
advice to each pool; the ledger is the guard. Every worker that maps pages debits it first and
credits it after unmapping, atomically across processes, and a map that would overdraw the budget
is refused (``PoolExhausted``). Then no bug in the operator -- and no arbitration without an
operator at all (every pool growing on demand, as kvcached does) -- can overcommit the device.

    /dev/shm/kvpool-ledger-<group>             {"budget_bytes": B, "owners": {"llama:0": 123, ...}}
    /dev/shm/kvpool-ledger-<group>.lock        flock-ed for each transaction
    /dev/shm/kvpool-ledger-<group>.llama:0     held flock-ed by its owner for its whole life

Every transaction holds an exclusive ``flock`` on the lock file and replaces the state file
atomically (a process killed mid-write leaves the previous state, never half of one). An owner's entry is dropped
when its lock file can be locked by someone else: its process is gone (the kernel released the
lock), however it died. flock works across the PID namespaces of a pod's containers, which a
pid check would not. An owner that opens again (a restarted worker) starts from zero: it maps from
scratch. The budget is the one the last opener gave (a new budget reaches the pods by restarting
them with it).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.errors import ConfigError, PoolExhausted

OWNER = re.compile(r"[A-Za-z0-9._:-]{1,128}")


@dataclass(frozen=True)
class LedgerState:
    budget_bytes: int
    owners: dict[str, int]  #: bytes each live owner has mapped

    @property
    def used_bytes(self) -> int:
        return sum(self.owners.values())


class Ledger:
    def __init__(self, path: str | Path, owner: str, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ConfigError(f"ledger budget_bytes must be > 0, got {budget_bytes}")
        if not OWNER.fullmatch(owner) or owner == "lock":
            raise ConfigError(f"ledger owner {owner!r} must be 1-128 of [A-Za-z0-9._:-]")
        self.path, self.owner = Path(path), owner
        self._mine = os.open(f"{self.path}.{owner}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._mine)
            raise ConfigError(f"ledger owner {owner!r} of {self.path} is held by a live process") from None
        self._fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._update(lambda state: {"budget_bytes": budget_bytes, "owners": {**state["owners"], owner: 0}})

    def debit(self, nbytes: int) -> None:
        """Take ``nbytes`` from the budget before mapping them, or raise ``PoolExhausted``."""

        def take(state: dict[str, Any]) -> dict[str, Any]:
            used = sum(state["owners"].values())
            if used + nbytes > state["budget_bytes"]:
                raise PoolExhausted(
                    f"node ledger {self.path}: mapping {nbytes} more bytes would overdraw the budget of "
                    f"{state['budget_bytes']} (in use {used}: {state['owners']})"
                )
            return {**state, "owners": {**state["owners"], self.owner: state["owners"][self.owner] + nbytes}}

        self._update(take)

    def credit(self, nbytes: int) -> None:
        """Give back ``nbytes`` after unmapping them (or after a map that failed)."""

        def give(state: dict[str, Any]) -> dict[str, Any]:
            mine = state["owners"][self.owner]
            return {**state, "owners": {**state["owners"], self.owner: max(0, mine - nbytes)}}

        self._update(give)

    def state(self) -> LedgerState:
        s = self._update(lambda state: state)
        return LedgerState(s["budget_bytes"], dict(s["owners"]))

    def close(self) -> None:
        """Leave the ledger: this owner's bytes are no longer counted."""
        if self._fd < 0:
            return

        def leave(state: dict[str, Any]) -> dict[str, Any]:
            return {**state, "owners": {k: v for k, v in state["owners"].items() if k != self.owner}}

        self._update(leave)
        os.close(self._fd)
        os.close(self._mine)  # releases the owner lock
        self._fd = -1

    def _update(self, change: Any) -> dict[str, Any]:
        """Read, drop dead owners, apply ``change``, write back: one transaction under the lock."""
        if self._fd < 0:
            raise ConfigError(f"ledger {self.path} is closed")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            try:
                state = json.loads(self.path.read_text())
            except FileNotFoundError:
                state = {"budget_bytes": 0, "owners": {}}
            state["owners"] = {k: v for k, v in state["owners"].items() if k == self.owner or self._alive(k)}
            before = json.dumps(state, sort_keys=True)
            new = change(state)
            after = json.dumps(new, sort_keys=True)
            if after != before:  # a read, or a credit of nothing, writes nothing
                tmp = self.path.with_name(f"{self.path.name}.{self.owner}.tmp")
                tmp.write_text(after)
                os.replace(tmp, self.path)
            return dict(new)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _alive(self, owner: str) -> bool:
        """Whether another owner's process still holds its lock file."""
        try:
            fd = os.open(f"{self.path}.{owner}", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # (a lock we took is released with the descriptor)
        return False

"""The resource's status, as data: per-model entries and the three conditions."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvpool_operator.balance import PodRound


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def degraded(rounds: list[PodRound]) -> bool:
    """No pod reached, or some server unreachable / shrink stuck: the one rule behind the Degraded
    condition and the kvpool_group_degraded series."""
    return not rounds or any(r.problems for r in rounds)


def model_status(r: PodRound, name: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    """One model on one pod: what its pool reported this round, and its last resize."""
    out: dict[str, Any] = {"pod": r.pod, "name": name, "reachable": name in r.snapshots}
    snap = r.snapshots.get(name)
    if snap is not None:
        out |= {
            "limitBytes": snap.limit_bytes,
            "mappedBytes": snap.mapped_bytes,
            "physicalBytes": snap.physical_bytes,
            "usedBytes": snap.used_bytes,
            "runningRequests": snap.running_requests,
            "waitingRequests": snap.waiting_requests,
            "preemptions": r.preemption_marks.get(name, snap.preemptions),
        }
    elif previous and "limitBytes" in previous:
        out["limitBytes"] = previous["limitBytes"]  # kept: the policy leaves an unreachable pool alone
    resize = next((z for z in reversed(r.resizes) if z.model == name), None)
    if resize is not None:
        out["lastResize"] = {"status": resize.status, "fromBytes": resize.old_bytes, "toBytes": resize.new_bytes,
                             "time": now()}  # fmt: skip
        if resize.status == "applied":
            out["limitBytes"] = resize.new_bytes
    elif previous and "lastResize" in previous:
        out["lastResize"] = previous["lastResize"]
    return out


def conditions(ready: bool, balanced: bool, degraded: bool, reason: str, message: str = "") -> list[dict[str, Any]]:
    t = now()

    def cond(kind: str, value: bool) -> dict[str, Any]:
        return {"type": kind, "status": "True" if value else "False", "reason": reason, "message": message,
                "lastTransitionTime": t}  # fmt: skip

    return [cond("Ready", ready), cond("Balanced", balanced), cond("Degraded", degraded)]

"""Reaching the model servers: their addresses from the Kubernetes API (EndpointSlices of the
per-model Services -- the same path a cluster's kube-proxy uses), their pools through the admin
API (``GET /kvpool``, ``PUT /kvpool/limit``; ``docs/api.md``). The operator's only lever.

``AdminAPI`` is the seam: the balancer takes any implementation (``AdminClient`` speaks HTTP; the
tests put a fake over a real ``KVPool`` behind it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx

from kvpool_operator.builders import ADMIN_PORT_NAME, GROUP_LABEL, MODEL_LABEL
from kvpool_operator.wire import PoolState, ResizeReply, WireError

T = TypeVar("T")


class PoolUnreachable(Exception):
    """A server did not answer (or answered with an error); the message says which and why."""


@dataclass(frozen=True)
class Endpoint:
    pod: str  #: the pod's address: one GPU, one balancing unit
    model: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.pod}]" if ":" in self.pod else self.pod
        return f"http://{host}:{self.port}"


def endpoints_from_slices(slices: list[dict[str, Any]]) -> list[Endpoint]:
    """Ready endpoints of the per-model Services' EndpointSlices (v1beta1 on Kubernetes 1.20, v1
    later: the fields read here are the same), at their admin port."""
    out: list[Endpoint] = []
    for s in slices:
        model = (s.get("metadata", {}).get("labels") or {}).get(MODEL_LABEL)
        port = next((p.get("port") for p in s.get("ports") or [] if p.get("name") == ADMIN_PORT_NAME), None)
        if not model or port is None:
            continue
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            out.extend(Endpoint(addr, model, int(port)) for addr in ep.get("addresses", [])[:1])
    return out


def slice_selector(group: str) -> str:
    return f"{GROUP_LABEL}={group},{MODEL_LABEL}"


class AdminAPI(Protocol):
    """What a round asks of the model servers; each call raises PoolUnreachable on any failure."""

    def snapshot(self, ep: Endpoint) -> PoolState: ...

    def set_limit(self, ep: Endpoint, limit_bytes: int, revision: int) -> ResizeReply: ...

    def close(self) -> None: ...


class AdminClient:
    """Synchronous admin-API client over HTTP (the operator's handlers run in kopf's thread pool)."""

    def __init__(self, token: str | None = None, timeout_s: float = 5.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    def snapshot(self, ep: Endpoint) -> PoolState:
        return self._read(ep, PoolState.from_json, self._call("GET", ep, "/kvpool"))

    def set_limit(self, ep: Endpoint, limit_bytes: int, revision: int) -> ResizeReply:
        reply = self._call("PUT", ep, "/kvpool/limit", {"limit_bytes": limit_bytes, "revision": revision})
        return self._read(ep, ResizeReply.from_json, reply)

    @staticmethod
    def _read(ep: Endpoint, parse: Callable[[dict[str, Any]], T], body: dict[str, Any]) -> T:
        try:
            return parse(body)
        except WireError as e:
            raise PoolUnreachable(f"{ep.model} at {ep.url}: {e}") from e

    def _call(self, method: str, ep: Endpoint, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            r = self._http.request(method, ep.url + path, json=body)
        except httpx.HTTPError as e:
            raise PoolUnreachable(f"{ep.model} at {ep.url}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise PoolUnreachable(f"{ep.model} at {ep.url}: HTTP {r.status_code}: {r.text[:200]}")
        result: dict[str, Any] = r.json()
        return result

    def close(self) -> None:
        self._http.close()

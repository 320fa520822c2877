"""The group's model servers as the router sees them: a base URL and whether it is ready now.

A background task asks each server's ``/readyz`` every ``poll_s``; a request that cannot reach a
server marks it not ready at once, so the next ones get a 503 with ``Retry-After`` instead of a
connection error, until the poll sees the server back."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger("kvpool_server.router")


@dataclass
class Upstream:
    name: str
    url: str
    ready: bool = False


class Upstreams:
    def __init__(self, urls: dict[str, str], client: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        self.by_name = {name: Upstream(name, url) for name, url in urls.items()}
        self.client = client
        self._gauge = Gauge(
            "kvpool_router_upstream_ready", "1 when the model's server answers /readyz", ["model"], registry=registry
        )
        for name in self.by_name:
            self._gauge.labels(name).set(0)

    def names(self) -> list[str]:
        return list(self.by_name)

    def all_ready(self) -> bool:
        return all(u.ready for u in self.by_name.values())

    def mark(self, up: Upstream, ready: bool) -> None:
        if up.ready != ready:
            log.info("model %s is %s", up.name, "ready" if ready else "not ready")
        up.ready = ready
        self._gauge.labels(up.name).set(int(ready))

    async def check(self, up: Upstream) -> None:
        try:
            ready = (await self.client.get(up.url + "/readyz", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            ready = False
        self.mark(up, ready)

    async def poll(self, every_s: float) -> None:
        """Run until cancelled (the app's lifespan owns the task)."""
        while True:
            await asyncio.gather(*(self.check(u) for u in self.by_name.values()))
            await asyncio.sleep(every_s)

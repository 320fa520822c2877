"""The group's model servers as the router sees them: a base URL and whether it is ready now.

A background task asks each server's ``/readyz`` every ``poll_s``; a request that cannot reach a
server marks it not ready at once, so the next ones get a 503 with ``Retry-After`` instead of a
connection error, until the poll sees the server back."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger("kvpool_server.router")


@dataclass
class Upstream:
    name: str
    url: str
    ready: bool = False


class Upstreams:
    def __init__(self, urls: dict[str, str], registry: CollectorRegistry) -> None:
        self.by_name = {name: Upstream(name, url) for name, url in urls.items()}
        self._session: aiohttp.ClientSession | None = None
        self._gauge = Gauge(
            "kvpool_router_upstream_ready", "1 when the model's server answers /readyz", ["model"], registry=registry
        )
        for name in self.by_name:
            self._gauge.labels(name).set(0)

    def open(self, connect_timeout_s: float) -> None:
        """The one client session, made in the running loop (the app's lifespan)."""
        # Idle connections expire well before the servers' keep-alive (uvicorn's 5 s): reusing one
        # the server is closing at that moment would fail the request.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0)
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s)  # generation may take minutes
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstreams.open() was not called: the router's lifespan did not start")
        return self._session

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
            async with self.session.get(up.url + "/readyz", timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                ready = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ready = False
        self.mark(up, ready)

    async def poll(self, every_s: float) -> None:
        """Run until cancelled (the app's lifespan owns the task)."""
        while True:
            await asyncio.gather(*(self.check(u) for u in self.by_name.values()))
            await asyncio.sleep(every_s)

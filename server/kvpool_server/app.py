"""Assemble the server: vLLM's OpenAI app (plus the read-only snapshot, kvpool metrics and probes)
on the public port, and the admin API on an app of its own for the admin port."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvpool.control import AsyncControlClient
from kvpool.vllm.launch.args import PoolEngineConfig
from kvpool.vllm.launch.openai import openai_app, prometheus_registry
from kvpool_server.admin import PoolAdmin, control_router, snapshot_router
from kvpool_server.metrics import PoolCollector, ResizeTimer
from kvpool_server.settings import ServerSettings

DEMAND = {
    "vllm:num_requests_running": "running_requests",
    "vllm:num_requests_waiting": "waiting_requests",
    "vllm:num_preemptions": "preemptions",
    "vllm:request_success": "finished_requests",  # a counter family: its samples end in _total
}


def demand_reader(registry: Any) -> Callable[[], dict[str, int]]:
    """Running / waiting requests, preemptions and finished requests, summed from vLLM's own
    series (every finish reason, every engine)."""

    def read() -> dict[str, int]:
        out = dict.fromkeys(DEMAND.values(), 0)
        for family in registry.collect():
            key = DEMAND.get(family.name)
            if key is not None:
                out[key] += int(sum(s.value for s in family.samples if not s.name.endswith("_created")))
        return out

    return read


@dataclass(frozen=True)
class Apps:
    public: FastAPI  # the OpenAI port: vLLM's routes, GET /kvpool, /metrics, /livez, /readyz
    admin: FastAPI  # the admin port: every /kvpool route


async def build_apps(settings: ServerSettings, pool: PoolEngineConfig, args: argparse.Namespace, client: Any) -> Apps:
    app: FastAPI = await openai_app(client, args)
    model = pool.settings().model
    registry = prometheus_registry()
    collector = PoolCollector(model)
    registry.register(collector)
    control = AsyncControlClient(pool.control_address, timeout_s=pool.settings().control_timeout_s,
                                 wake=client.is_sleeping)  # fmt: skip
    admin = PoolAdmin(control, ResizeTimer(registry, model), demand_reader(registry), settings.admin_token_source())
    app.include_router(snapshot_router(admin))
    _add_probes(app, admin, client)
    _refresh_metrics_on_scrape(app, admin, collector, registry)
    door = FastAPI(title="kvpool admin", version="1", description="The pool's admin API (docs/api.md)")
    door.include_router(snapshot_router(admin))
    door.include_router(control_router(admin))
    return Apps(app, door)


def _add_probes(app: FastAPI, admin: PoolAdmin, client: Any) -> None:
    async def livez() -> dict[str, bool]:
        return {"alive": True}  # the process and its event loop answer

    async def readyz() -> Response:
        try:
            await client.check_health()
            await admin.call(admin.control.snapshot())
        except (HTTPException, Exception) as e:  # any failure means: do not route traffic here
            return JSONResponse({"ready": False, "reason": str(e)}, status_code=503)
        return JSONResponse({"ready": True})

    app.add_api_route("/livez", livez, methods=["GET"], summary="Liveness: the server process answers")
    app.add_api_route("/readyz", readyz, methods=["GET"], summary="Readiness: engine and pool are up")


def _refresh_metrics_on_scrape(app: FastAPI, admin: PoolAdmin, collector: PoolCollector, registry: Any) -> None:
    """Serve ``/metrics`` ourselves, ahead of vLLM's mount: refresh the snapshot, then render the
    one registry (vLLM's series and ours). vLLM's app is already built, so a middleware cannot be
    added any more; a route placed first in the routing table can."""

    async def metrics() -> Response:
        try:
            collector.latest = await admin.snapshot()
        except HTTPException:
            collector.latest = None  # kvpool_up 0; vLLM's series are still served
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.router.routes.insert(0, APIRoute("/metrics", metrics, methods=["GET"], include_in_schema=False))

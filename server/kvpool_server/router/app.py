"""The router's routes.

    GET  /v1/models                  every model of the group (OpenAI's list format)
    POST /v1/..., /tokenize, ...     to the server named by the body's ``model``
    GET  /kvpool                     every model's pool snapshot, keyed by model (read-only)
    GET  /metrics                    kvpool_router_* (requests by model and code, latencies)
    GET  /readyz, /livez             ready only when every model's server is

Errors are OpenAI-shaped: 400 for a body without a usable ``model``, 404 for a model the group
does not serve (naming those it does), 503 with ``Retry-After`` for a model that is not ready,
401 for a wrong API key (``--api-key``) or a missing admin token, 403 for a wrong admin token."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvpool_server.router.errors import RouterError
from kvpool_server.router.proxy import Forwarder, RouterMetrics, model_of
from kvpool_server.router.settings import RouterSettings
from kvpool_server.router.upstreams import Upstreams

# OpenAI routes that vLLM's server answers and that carry ``model`` in a JSON body.
FORWARDED = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/score", "/v1/rerank",
             "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank"]  # fmt: skip


def _bearer_ok(request: Request, secret: str | None) -> bool:
    if secret is None:
        return True
    got = request.headers.get("authorization", "")
    return secrets.compare_digest(got.encode(), f"Bearer {secret}".encode())


class Router:
    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.api_key = settings.api_key.get_secret_value() if settings.api_key else None
        self.admin_token = settings.admin_token_source()  # re-read when its file changes
        self.registry = CollectorRegistry()
        self.upstreams = Upstreams(settings.upstreams(), self.registry)
        self.forwarder = Forwarder(self.upstreams, RouterMetrics(self.registry), settings.retry_after_s)

    async def _get_json(self, name: str, path: str, headers: dict[str, str], timeout_s: float) -> Any:
        url = self.upstreams.by_name[name].url + path
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self.upstreams.session.get(url, headers=headers, timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.json()

    def check_api_key(self, request: Request) -> None:
        if not _bearer_ok(request, self.api_key):
            raise RouterError(401, "a wrong or missing API key: send 'Authorization: Bearer <key>'")

    async def forward(self, request: Request) -> Response:
        self.check_api_key(request)
        body = await request.body()
        return await self.forwarder.forward(request, model_of(body, self.upstreams.names()), body)

    async def list_models(self, request: Request) -> dict[str, Any]:
        """Each server's own model card; a placeholder for a server that does not answer."""
        self.check_api_key(request)
        auth = {"authorization": request.headers["authorization"]} if "authorization" in request.headers else {}

        async def card(name: str) -> dict[str, Any]:
            try:
                body = await self._get_json(name, "/v1/models", auth, 5.0)
                cards = [c for c in body.get("data", []) if c.get("id") == name]
                if cards:
                    return dict(cards[0])
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                pass
            return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "kvpool"}

        return {"object": "list", "data": list(await asyncio.gather(*map(card, self.upstreams.names())))}

    async def snapshots(self, request: Request) -> dict[str, Any]:
        token = self.admin_token.current()
        if not _bearer_ok(request, token):  # as a server's admin routes: 401 none, 403 wrong
            status = 403 if "authorization" in request.headers else 401
            raise RouterError(status, "a wrong or missing admin token: send 'Authorization: Bearer <token>'")
        auth = {"authorization": f"Bearer {token}"} if token else {}

        async def one(name: str) -> Any:
            try:
                return await self._get_json(name, "/kvpool", auth, 10.0)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                return {"error": f"{type(e).__name__}: {e}"}

        names = self.upstreams.names()
        return {"models": dict(zip(names, await asyncio.gather(*map(one, names)), strict=True))}

    def readiness(self) -> JSONResponse:
        models = {u.name: u.ready for u in self.upstreams.by_name.values()}
        return JSONResponse({"ready": all(models.values()), "models": models}, 200 if all(models.values()) else 503)

    def metrics(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def build_app(settings: RouterSettings) -> FastAPI:
    router = Router(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        router.upstreams.open(settings.connect_timeout_s)
        poller = asyncio.create_task(router.upstreams.poll(settings.poll_s))
        yield
        poller.cancel()
        await router.upstreams.close()

    app = FastAPI(title="kvpool-router", lifespan=lifespan)
    app.state.router = router
    app.add_exception_handler(RouterError, lambda _req, e: e.response())
    app.add_api_route("/v1/models", router.list_models, methods=["GET"])
    for path in FORWARDED:
        app.add_api_route(path, router.forward, methods=["POST"])
    app.add_api_route("/kvpool", router.snapshots, methods=["GET"])
    app.add_api_route("/metrics", router.metrics, methods=["GET"])
    app.add_api_route("/readyz", router.readiness, methods=["GET"])
    app.add_api_route("/livez", lambda: {"alive": True}, methods=["GET"])
    return app

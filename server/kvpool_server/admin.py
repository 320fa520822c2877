"""The pool admin API: the operator's only lever (the JSON shapes: ``docs/api.md``).

    GET  /kvpool        -> the PoolSnapshot (plus demand signals from vLLM's own metrics)
    PUT  /kvpool/limit  {"limit_bytes": N, "revision": R} -> the ResizeResult
                           (status applied | deferred | stale | conflict)
    POST /kvpool/trim   -> the TrimResult: idle pages released now
    GET  /kvpool/integrity -> {"ok": true}, or a 500 naming the broken invariant

They are served on their own port (``--admin-port``), so that a NetworkPolicy can let only the
operator reach them; the OpenAI port serves ``GET /kvpool`` alone (read-only, for the router and
for people) and answers 404 to the rest. Bearer-token protected when a token is configured (the
token file is read again when it changes). Errors are 4xx with a message that says what
to fix (422: the body; 400: a value the pool refuses), 503 when the engine does not answer.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from kvpool import ConfigError, DemandStats, KVPoolError, PoolSnapshot
from kvpool.control import AsyncControlClient, EngineUnavailable
from kvpool_server.flags import AdminToken
from kvpool_server.metrics import ResizeTimer

T = TypeVar("T")

log = logging.getLogger("kvpool_server.admin")


class LimitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit_bytes: StrictInt = Field(ge=0, description="new physical KV limit in bytes (whole pages are used)")
    revision: StrictInt = Field(
        ge=0, description="monotonic per pool: older = stale, same with another limit = conflict"
    )


class PoolAdmin:
    """Holds what the routes need: the control client, the demand reader and the resize timer."""

    def __init__(
        self,
        control: AsyncControlClient,
        timer: ResizeTimer,
        demand: Callable[[], dict[str, int]],
        token: AdminToken,
    ) -> None:
        self.control, self.timer, self.demand, self.token = control, timer, demand, token

    async def call(self, request: Coroutine[Any, Any, T]) -> T:
        """One control request (``self.control.snapshot()``, ...) with its errors as HTTP errors."""
        try:
            return await request
        except ConfigError as e:
            raise HTTPException(400, detail=str(e)) from e
        except EngineUnavailable as e:
            raise HTTPException(503, detail=f"the engine is not answering: {e}") from e
        except KVPoolError as e:
            raise HTTPException(500, detail=str(e)) from e

    async def snapshot(self) -> PoolSnapshot:
        snap = dataclasses.replace(await self.call(self.control.snapshot()), demand=DemandStats(**self.demand()))
        self.timer.seen(snap)
        return snap


# What the routes answer besides 200 and FastAPI's 422, in the OpenAPI schema (the fuzz tests
# hold every reply to it).
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "a value the pool refuses; the message says which and why"},
    401: {"description": "no bearer token: send 'Authorization: Bearer <admin token>'"},
    403: {"description": "a wrong admin token"},
    503: {"description": "the engine does not answer"},
}


def _authorize(admin: PoolAdmin) -> Callable[..., Awaitable[None]]:
    async def check(authorization: Annotated[str | None, Header()] = None) -> None:
        token = admin.token.current()
        if token is None:
            return
        if not authorization or not authorization.startswith("Bearer "):
            raise HTTPException(
                401,
                detail="missing bearer token: send 'Authorization: Bearer <admin token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not secrets.compare_digest(authorization.removeprefix("Bearer ").strip(), token):
            raise HTTPException(403, detail="wrong admin token")

    return check


def snapshot_router(admin: PoolAdmin) -> APIRouter:
    """``GET /kvpool`` alone: what the OpenAI port serves of the admin API."""
    router = APIRouter(prefix="/kvpool", tags=["kvpool"], dependencies=[Depends(_authorize(admin))], responses=ERRORS)

    @router.get("", summary="The pool's snapshot")
    async def get_snapshot() -> dict[str, Any]:
        return (await admin.snapshot()).to_dict()

    return router


def control_router(admin: PoolAdmin) -> APIRouter:
    """The routes that change the pool or cost the engine a pass: the admin port's alone."""
    router = APIRouter(prefix="/kvpool", tags=["kvpool"], dependencies=[Depends(_authorize(admin))], responses=ERRORS)

    @router.put("/limit", summary="Set the physical KV limit")
    async def put_limit(body: LimitRequest, request: Request) -> dict[str, Any]:
        before = (await admin.call(admin.control.snapshot())).limit_bytes
        start = time.monotonic()
        result = await admin.call(admin.control.resize(body.limit_bytes, body.revision))
        after = result.effective_limit_bytes
        admin.timer.answered(body.revision, before, after, result.status, time.monotonic() - start)
        log.info(
            "resize",
            extra={
                "limit_bytes": body.limit_bytes,
                "revision": body.revision,
                **result.to_dict(),
                "request_id": request.headers.get("x-request-id"),
            },
        )
        return result.to_dict()

    @router.get("/integrity", summary="Run the pool's check_integrity() in the engine")
    async def get_integrity() -> dict[str, bool]:
        await admin.call(admin.control.check_integrity())  # a broken invariant: a 500 with its numbers
        return {"ok": True}

    @router.post("/trim", summary="Release idle pages now")
    async def post_trim() -> dict[str, Any]:
        return (await admin.call(admin.control.trim())).to_dict()

    return router

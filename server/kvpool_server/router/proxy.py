"""Forwarding one request to the server of its model, and its response back, unbuffered.

The request body is read once (the router must see ``model``), then sent upstream as is. The
response streams back chunk by chunk as aiohttp receives it: an SSE token reaches the client when
the server sends it. Status, body and headers pass through (a 400 from vLLM stays a 400), less
the hop-by-hop headers. A client that goes away -- before the response starts, or mid-stream --
closes the upstream connection, which is how vLLM learns to abort the request and free its KV
blocks.

aiohttp rather than httpx: under 64 concurrent streams httpx's connection pool made a second
back-to-back round ~2x slower to its first token than the first (measured here, bench_router);
aiohttp's showed no such effect."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable

import aiohttp
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram

from kvpool_server.router.errors import RouterError
from kvpool_server.router.upstreams import Upstream, Upstreams

log = logging.getLogger("kvpool_server.router")
# Hop-by-hop (RFC 9110 7.6.1) or recomputed by the HTTP stack on each side.
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te"}
_DROP_RESPONSE = {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ClientGone(Exception):
    """The client disconnected before the server answered."""


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("kvpool_router_requests", "requests by model and HTTP status", ["model", "code"],
                                registry=registry)  # fmt: skip
        self.ttft = Histogram("kvpool_router_time_to_first_byte_seconds",
                              "arrival to the first body byte from the server (the first token of a stream)",
                              ["model"], buckets=_BUCKETS, registry=registry)  # fmt: skip
        self.latency = Histogram("kvpool_router_request_duration_seconds", "arrival to the last byte sent",
                                 ["model"], buckets=_BUCKETS, registry=registry)  # fmt: skip


def model_of(body: bytes, names: list[str]) -> str:
    """The body's ``model``, one of ``names``; else a RouterError that says what to fix."""
    try:
        data = json.loads(body) if body else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RouterError(400, f"the body is not JSON ({e}); send a JSON object with a 'model' field") from e
    if not isinstance(data, dict):
        raise RouterError(400, "the body must be a JSON object with a 'model' field", "model")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RouterError(400, f"'model' is missing or not a string; this group serves: {', '.join(names)}", "model")
    if model not in names:
        raise RouterError(404, f"model {model!r} does not exist; this group serves: {', '.join(names)}", "model")
    return model


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[aiohttp.ClientResponse]) -> aiohttp.ClientResponse:
    """``work``'s result, or ClientGone (and ``work`` cancelled) if the client leaves first."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise ClientGone


class Forwarder:
    def __init__(self, upstreams: Upstreams, metrics: RouterMetrics, retry_after_s: int) -> None:
        self.upstreams, self.metrics, self.retry_after_s = upstreams, metrics, retry_after_s

    def _unavailable(self, up: Upstream, why: str) -> RouterError:
        return RouterError(503, f"model {up.name!r} is not ready ({why}); retry shortly", "model", self.retry_after_s)

    async def forward(self, request: Request, model: str, body: bytes) -> Response:
        up, started = self.upstreams.by_name[model], time.perf_counter()
        if not up.ready:
            raise self._unavailable(up, "its server does not answer /readyz yet")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST]
        send = self.upstreams.session.request(request.method, up.url + request.url.path, headers=headers,
                                              params=list(request.query_params.multi_items()), data=body)  # fmt: skip
        try:
            resp = await unless_disconnected(request, send)
        except ClientGone:
            self.metrics.requests.labels(model, "499").inc()  # nginx's "client closed request"
            return Response(status_code=499)
        except aiohttp.ClientConnectorError as e:  # nobody listens: not ready until the poll says so
            self.upstreams.mark(up, False)
            raise self._unavailable(up, f"{type(e).__name__}: {e}") from e
        except (aiohttp.ClientError, TimeoutError) as e:  # it listens but broke this off: not retried
            self.metrics.requests.labels(model, "502").inc()
            raise RouterError(502, f"the server of {model!r} broke off the request ({type(e).__name__}); retry") from e
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
        return StreamingResponse(self._relay(resp, model, started), status_code=resp.status, headers=out)

    async def _relay(self, resp: aiohttp.ClientResponse, model: str, started: float) -> AsyncIterator[bytes]:
        first, code, whole = True, str(resp.status), False
        try:
            async for chunk in resp.content.iter_any():
                if first:
                    self.metrics.ttft.labels(model).observe(time.perf_counter() - started)
                    first = False
                yield chunk
            whole = True
        except aiohttp.ClientError as e:  # the server went away mid-response
            log.warning("model %s: the server broke off a response: %s", model, e)
            code = "502"
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                error = {"message": f"the server of {model!r} broke off the stream", "type": "BadGateway", "code": 502}
                yield f"data: {json.dumps({'error': error})}\n\n".encode()
        except asyncio.CancelledError:  # the client went away mid-stream
            code = "499"
            raise
        finally:
            # a whole response frees its connection for reuse; a cut one closes it, which is how
            # vLLM learns to abort the request
            resp.release() if whole else resp.close()
            self.metrics.requests.labels(model, code).inc()
            self.metrics.latency.labels(model).observe(time.perf_counter() - started)

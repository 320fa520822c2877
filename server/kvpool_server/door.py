"""The admin port: its socket, bound before the engine starts (a port in use fails the start at
once, naming the flag), and a uvicorn server for the admin app beside vLLM's on the same loop."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn

from kvpool import ConfigError


def bind_admin_port(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        why = "the port is in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise ConfigError(f"--admin-port {port} on {host}: {why}; choose another (KVPOOL_ADMIN_PORT)") from e


class _QuietServer(uvicorn.Server):
    """No signal handlers of its own: vLLM's (on the same loop) drive the shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(app: Any, sock: socket.socket, log_level: str = "warning") -> AsyncIterator[None]:
    """Serve ``app`` on ``sock`` while the block runs; closed with it (the operator retries a
    resize that the shutdown cut: its revision makes the retry safe)."""
    # an admin call still open at shutdown (a long integrity check) is cut after 5 s, not waited on
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=5)
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, timeout=10)
        sock.close()

"""The control channel: resize / trim / snapshot from the HTTP process to the engine core.

    API server process                         engine-core process
    AsyncControlClient --abstract unix socket--> ControlServer thread
      send {"op": ..., "args": {...}}              put ControlRequest in the mailbox
      read {"queued": true}    <-----------------  (the engine thread serves it: next step,
      await wake()  (vLLM utility call: wakes        or at once from has_pending_push_work
                     an idle engine loop)             when the loop is idle)
      read {"ok": ..., "result"|"error"} <------  reply.result(timeout)

Why this shape: the BlockPool may only be touched on the engine thread, and an idle engine
thread sleeps on vLLM's input queue; a public utility call (``is_sleeping``) wakes it. The socket
lives in the *abstract* namespace (no file, nothing in /dev/shm), named with a random token per
instance, so two servers in one pod or node never collide, and it vanishes with the process.
One JSON line per message; one request per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import socket
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from kvpool.errors import BackendUnavailable, ConfigError, KVPoolError
from kvpool.snapshot import PoolSnapshot

log = logging.getLogger(__name__)


class EngineUnavailable(BackendUnavailable):
    """The engine behind a control address is not running (not started yet, or gone)."""


def _abstract(address: str) -> str:
    if not address or "\0" in address or "/" in address:
        raise ConfigError(f"control address {address!r} must be a non-empty name without '/' or NUL")
    return "\0" + address


def _encode(result: Any) -> Any:
    return result.to_dict() if isinstance(result, PoolSnapshot) else result


class ControlServer:
    """Accepts control requests and hands them to the engine thread through ``mailbox``."""

    def __init__(self, address: str, mailbox: queue.Queue[Any], timeout_s: float, make_request: Any) -> None:
        self._mailbox, self._timeout, self._make = mailbox, timeout_s, make_request
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(_abstract(address))
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, name="kvpool-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._exchange(conn)
        except OSError as e:  # the client went away mid-request; the engine state is unaffected
            log.info("kvpool control: client disconnected: %s", e)

    def _exchange(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            try:
                msg = json.loads(f.readline())
                req = self._make(str(msg["op"]), dict(msg.get("args") or {}))
            except (ValueError, KeyError, TypeError) as e:
                _send(f, {"ok": False, "type": "ConfigError", "error": f"malformed control request: {e}"})
                return
            self._mailbox.put(req)
            _send(f, {"queued": True})
            try:
                _send(f, {"ok": True, "result": _encode(req.reply.result(self._timeout))})
            except FutureTimeout:
                req.reply.cancel()
                _send(f, {"ok": False, "type": "Timeout", "error": f"engine did not serve it in {self._timeout}s"})
            except Exception as e:
                _send(f, {"ok": False, "type": type(e).__name__, "error": str(e)})

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed or never connected
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _send(f: Any, msg: dict[str, Any]) -> None:
    f.write(json.dumps(msg).encode() + b"\n")
    f.flush()


def _result(msg: dict[str, Any]) -> Any:
    if msg.get("ok"):
        return msg["result"]
    kind, error = msg.get("type"), msg.get("error", "unknown error")
    if kind == "ConfigError":
        raise ConfigError(error)
    if kind == "Timeout":
        raise EngineUnavailable(error)
    raise KVPoolError(f"{kind}: {error}")


class AsyncControlClient:
    """Talks to one engine's ControlServer; ``wake`` is awaited once the request is queued."""

    def __init__(self, address: str, timeout_s: float = 30.0, wake: Callable[[], Awaitable[Any]] | None = None):
        self._path, self._timeout, self._wake = _abstract(address), timeout_s, wake
        self.address = address

    async def call(self, op: str, **args: Any) -> Any:
        try:
            return await asyncio.wait_for(self._call(op, args), self._timeout + 5)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            raise EngineUnavailable(f"no kvpool engine listens at control address {self.address!r}: {e}") from e
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionResetError) as e:
            raise EngineUnavailable(f"kvpool engine at {self.address!r} did not answer: {e!r}") from e

    async def _call(self, op: str, args: dict[str, Any]) -> Any:
        # Connect the socket ourselves: uvloop's open_unix_connection(path) rejects abstract names.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self._path)
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            writer.write(json.dumps({"op": op, "args": args}).encode() + b"\n")
            await writer.drain()
            first = json.loads(await reader.readuntil(b"\n"))
            if not first.get("queued"):
                return _result(first)
            if self._wake is not None:
                await self._wake()
            return _result(json.loads(await reader.readuntil(b"\n")))
        finally:
            writer.close()

    async def snapshot(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("snapshot")
        return result

    async def resize(self, limit_bytes: int, revision: int) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("resize", limit_bytes=limit_bytes, revision=revision)
        return result

    async def trim(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("trim")
        return result

    async def check_integrity(self) -> None:
        await self.call("check")

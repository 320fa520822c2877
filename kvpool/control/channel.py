"""The control channel: resize / trim / snapshot from the HTTP process to the engine core.

    API server process                         engine-core process
    AsyncControlClient --abstract unix socket--> ControlServer thread
      send {"op": ..., "args": {...}}              put ControlRequest in the mailbox
      read {"queued": true}    <-----------------  (the engine thread serves it: next step,
      await wake()  (vLLM utility call: wakes        or at once from has_pending_push_work
                     an idle engine loop)             when the loop is idle)
      read {"ok": ..., "result"|"kind"} <-------  reply.result(timeout)

The messages and their replies: :mod:`kvpool.control.messages`.

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

from kvpool.control.messages import (
    Check,
    ControlOp,
    ControlRequest,
    ErrorKind,
    IntegrityFailure,
    Reply,
    Resize,
    Snapshot,
    Trim,
    decode_op,
    decode_reply,
    encode_op,
    encode_reply,
    error_kind,
)  # fmt: skip
from kvpool.errors import BackendUnavailable, ConfigError, KVPoolError
from kvpool.snapshot import PoolSnapshot, ResizeResult, TrimResult

log = logging.getLogger(__name__)


class EngineUnavailable(BackendUnavailable):
    """The engine behind a control address is not running (not started yet, or gone)."""


def _abstract(address: str) -> str:
    if not address or "\0" in address or "/" in address:
        raise ConfigError(f"control address {address!r} must be a non-empty name without '/' or NUL")
    return "\0" + address


class ControlServer:
    """Accepts control requests and hands them to the engine thread through ``mailbox``."""

    def __init__(self, address: str, mailbox: queue.Queue[ControlRequest], timeout_s: float) -> None:
        self._mailbox, self._timeout = mailbox, timeout_s
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
                req = ControlRequest(decode_op(json.loads(f.readline())))
            except ValueError as e:  # ConfigError, or not JSON at all
                _send(f, _failure(ErrorKind.CONFIG, f"malformed control request: {e}"))
                return
            self._mailbox.put(req)
            _send(f, {"queued": True})
            try:
                _send(f, {"ok": True, "result": encode_reply(req.reply.result(self._timeout))})
            except FutureTimeout:
                req.reply.cancel()
                _send(f, _failure(ErrorKind.TIMEOUT, f"engine did not serve it in {self._timeout}s"))
            except Exception as e:
                _send(f, _failure(error_kind(e), f"{type(e).__name__}: {e}"))

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed or never connected
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _failure(kind: ErrorKind, error: str) -> dict[str, Any]:
    return {"ok": False, "kind": kind.value, "error": error}


def _send(f: Any, msg: dict[str, Any]) -> None:
    f.write(json.dumps(msg).encode() + b"\n")
    f.flush()


_RAISE: dict[str, type[KVPoolError]] = {
    ErrorKind.CONFIG.value: ConfigError,
    ErrorKind.TIMEOUT.value: EngineUnavailable,
    ErrorKind.INTEGRITY.value: IntegrityFailure,
}


def _result(op: ControlOp, msg: dict[str, Any]) -> Reply:
    if msg.get("ok"):
        return decode_reply(op, msg["result"])
    raise _RAISE.get(str(msg.get("kind")), KVPoolError)(msg.get("error", "unknown error"))


class AsyncControlClient:
    """Talks to one engine's ControlServer; ``wake`` is awaited once the request is queued."""

    def __init__(self, address: str, timeout_s: float = 30.0, wake: Callable[[], Awaitable[Any]] | None = None):
        self._path, self._timeout, self._wake = _abstract(address), timeout_s, wake
        self.address = address

    async def call(self, op: ControlOp) -> Reply:
        try:
            return await asyncio.wait_for(self._call(op), self._timeout + 5)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            raise EngineUnavailable(f"no kvpool engine listens at control address {self.address!r}: {e}") from e
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionResetError) as e:
            raise EngineUnavailable(f"kvpool engine at {self.address!r} did not answer: {e!r}") from e

    async def _call(self, op: ControlOp) -> Reply:
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
            writer.write(json.dumps(encode_op(op)).encode() + b"\n")
            await writer.drain()
            first = json.loads(await reader.readuntil(b"\n"))
            if not first.get("queued"):
                return _result(op, first)
            if self._wake is not None:
                await self._wake()
            return _result(op, json.loads(await reader.readuntil(b"\n")))
        finally:
            writer.close()

    async def snapshot(self) -> PoolSnapshot:
        snap = await self.call(Snapshot())
        assert isinstance(snap, PoolSnapshot)
        return snap

    async def resize(self, limit_bytes: int, revision: int) -> ResizeResult:
        result = await self.call(Resize(limit_bytes, revision))
        assert isinstance(result, ResizeResult)
        return result

    async def trim(self) -> TrimResult:
        result = await self.call(Trim())
        assert isinstance(result, TrimResult)
        return result

    async def check_integrity(self) -> None:
        await self.call(Check())

"""The control channel over a real abstract unix socket, served by a thread over a real
standalone ``KVPool`` (in a server the engine thread serves the mailbox over vLLM's BlockPool):
typed operations in, the pool's own result types out, errors as their kinds."""

from __future__ import annotations

import asyncio
import json
import queue
import secrets
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kvpool import ConfigError, KVPool, KVPoolError, PoolSnapshot, ResizeResult, ResizeStatus, TrimResult
from kvpool.control import (
    AsyncControlClient,
    Check,
    ControlRequest,
    ControlServer,
    EngineUnavailable,
    Resize,
    Snapshot,
    Trim,
)
from kvpool.control.messages import IntegrityFailure, Reply, decode_op, encode_op
from tests.kvpool.factories import MiB, make_config


def serve(pool: KVPool, req: ControlRequest) -> Reply:
    match req.op:
        case Snapshot():
            return pool.snapshot()
        case Resize(limit_bytes=limit, revision=revision):
            return pool.resize(limit, revision)
        case Trim():
            return pool.trim()
        case Check():
            pool.check_integrity()
            return None


class Engine:
    """A mailbox thread over a pool; ``broken`` makes its integrity check fail."""

    def __init__(self, serve_requests: bool = True, timeout_s: float = 5.0) -> None:
        self.pool = KVPool(make_config())
        self.mailbox: queue.Queue[ControlRequest] = queue.Queue()
        self.address = f"kvpool-test-{secrets.token_hex(6)}"
        self.server = ControlServer(self.address, self.mailbox, timeout_s)
        self.broken = False
        self.stop = threading.Event()
        if serve_requests:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                req = self.mailbox.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                if self.broken and isinstance(req.op, Check):
                    raise AssertionError("free counter 3 != 4 in free lists")
                req.reply.set_result(serve(self.pool, req))
            except Exception as e:
                req.reply.set_exception(e)

    def client(self) -> AsyncControlClient:
        return AsyncControlClient(self.address, timeout_s=2.0)

    def close(self) -> None:
        self.stop.set()
        self.server.close()
        self.pool.close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.close()


def test_operations_come_back_as_the_pools_own_result_types(engine: Engine) -> None:
    async def run() -> tuple[Any, ...]:
        c = engine.client()
        return (await c.snapshot(), await c.resize(4 * MiB, 3), await c.trim(), await c.check_integrity())

    snap, resized, trimmed, checked = asyncio.run(run())
    assert isinstance(snap, PoolSnapshot)
    assert snap.limit_bytes == 16 * MiB
    assert resized == ResizeResult(ResizeStatus.APPLIED, 3, 4 * MiB, resized.physical_bytes)
    assert isinstance(trimmed, TrimResult)
    assert checked is None
    assert engine.pool.snapshot().pending.revision == 3


def test_errors_cross_as_their_kinds(engine: Engine) -> None:
    c = engine.client()
    with pytest.raises(ConfigError, match="limit_bytes"):  # the pool refused the value
        asyncio.run(c.resize(-1, 1))
    engine.broken = True
    with pytest.raises(IntegrityFailure, match="free counter"):
        asyncio.run(c.check_integrity())
    assert engine.pool.snapshot().pending.revision == 0  # nothing changed


def test_an_engine_that_does_not_serve_is_unavailable_not_a_hang() -> None:
    idle = Engine(serve_requests=False, timeout_s=0.3)
    try:
        with pytest.raises(EngineUnavailable, match="did not serve it"):
            asyncio.run(idle.client().snapshot())
    finally:
        idle.close()
    with pytest.raises(EngineUnavailable, match="no kvpool engine listens"):
        asyncio.run(AsyncControlClient("kvpool-nobody-here", timeout_s=1).snapshot())


def raw(address: str, line: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + address)
        s.sendall(line + b"\n")
        answer: dict[str, Any] = json.loads(s.makefile("rb").readline())
        return answer


@pytest.mark.parametrize(
    ("line", "message"),
    [(b"not json", "malformed"), (b'{"op": "explode"}', "needs 'op'"),
     (b'{"op": "resize", "args": {"limit_bytes": 1}}', "revision"),
     (b'{"op": "resize", "args": {"limit_bytes": "1", "revision": 2}}', "must be an integer")],
)  # fmt: skip
def test_malformed_requests_are_config_errors_that_never_reach_the_engine(
    engine: Engine, line: bytes, message: str
) -> None:
    answer = raw(engine.address, line)
    assert (answer["ok"], answer["kind"]) == (False, "config")
    assert message in answer["error"]
    assert engine.mailbox.empty()


def test_every_operation_round_trips_through_its_wire_form() -> None:
    for op in (Snapshot(), Resize(5, 7), Trim(), Check()):
        assert decode_op(json.loads(json.dumps(encode_op(op)))) == op
    with pytest.raises(KVPoolError):
        decode_op({"op": "resize", "args": {"limit_bytes": True, "revision": 1}})  # a bool is no byte count

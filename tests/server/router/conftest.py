"""Real routers over real tiny-model servers: two models behind one port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.server.conftest import API_KEY, TOKEN, Server, free_port, start_server, stop_server, wait_ready


@dataclass
class Router:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_router(tmp: Path, upstreams: dict[str, str], *extra: str) -> Router:
    token = tmp / "admin-token"
    token.write_text(TOKEN)
    port = free_port()
    log = tmp / f"router-{port}.log"
    flags = [f"--upstream={name}={url}" for name, url in upstreams.items()]
    cmd = [sys.executable, "-m", "kvpool_server.router", "--port", str(port), "--admin-token-file", str(token),
           "--poll-s", "0.2", *flags, *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    router = Router(f"http://127.0.0.1:{port}", proc, log)
    wait_ready(proc, router.url, log, timeout_s=60, every_s=0.2)
    return router


def stop_router(router: Router) -> None:
    router.proc.terminate()
    router.proc.wait(timeout=30)


@pytest.fixture(scope="package")
def pair(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """Two tiny-model servers named alpha and beta, as one group pod runs them."""
    tmp = tmp_path_factory.mktemp("pair")
    servers = {name: start_server(tiny_model, tmp, "--api-key", API_KEY, "--served-model-name", name)
               for name in ("alpha", "beta")}  # fmt: skip
    yield servers
    for s in servers.values():
        stop_server(s)


@pytest.fixture(scope="package")
def router(pair: dict[str, Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    r = start_router(tmp_path_factory.mktemp("router"), {n: s.url for n, s in pair.items()}, "--api-key", API_KEY)
    yield r
    stop_router(r)

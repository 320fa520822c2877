"""The servers the side-by-side benchmarks start: stock vLLM's OpenAI server and ours, in the
variants that take one difference apart at a time, each started alone and stopped after its turn.

* ``stock``: ``vllm.entrypoints.openai.api_server``, the KV cache sized to the pool's limit.
* ``connector``: the same stock server with our connector's flags (``PoolEngineConfig.cli_args``)
  -- our engine behind vLLM's own API process: what the API process of ours costs apart.
* ``kvpool``: ``kvpool-server`` with a virtual range 4x its limit (the default shape).
* ``kvpool-novirt``: ``kvpool-server`` with virtual == limit: what the scheduler's larger block
  count costs apart.

Every server runs with ``VLLM_SERVER_DEV_MODE=1`` so that ``/server_info`` returns the engine's own
``VllmConfig`` for the side-by-side config print (localhost only; never in production).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import ttft_percentiles
from kvpool.units import parse_bytes

LIMIT, VIRTUAL = "512Mi", "2Gi"


@dataclass(frozen=True)
class Server:
    """One running server: its process, URL and log."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def distinct_ports(n: int) -> list[int]:
    """``n`` free ports, all different: each is held until all are chosen. ``free_port`` twice, or
    from threads at once, can return the same port -- a longtail run's model b then sent its 29
    requests to another model's server (HTTP 404: no such model)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def check_serves(url: str, name: str) -> None:
    """Raise unless the server at ``url`` serves ``name`` (a port another server holds answers
    /health too)."""
    r = httpx.get(f"{url}/v1/models", timeout=10)
    served: list[str] = [m["id"] for m in r.json()["data"]] if r.status_code == 200 else []
    if name not in served:
        what = served or f"no models (HTTP {r.status_code})"
        raise RuntimeError(f"{url} serves {what}, not {name!r}: its port is another server's")


def start(cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` and wait until its ``/health`` answers 200 (raises with the log's tail)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-2000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("server did not start")


def _stock_cmd(model: str, name: str, port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
            name, "--port", str(port), "--max-model-len", "2048", "--enforce-eager"]  # fmt: skip


def _connector(model: str, name: str, port: int) -> tuple[list[str], dict[str, str]]:
    from kvpool.vllm.launch.args import PoolEngineConfig

    pool = PoolEngineConfig(model=model, limit_bytes=parse_bytes(LIMIT), virtual_bytes=parse_bytes(VIRTUAL))
    return _stock_cmd(model, name, port) + pool.cli_args(), pool.env()


def _kvpool(virtual: str) -> Callable[[str, str, int], tuple[list[str], dict[str, str]]]:
    def make(model: str, name: str, port: int) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "kvpool_server", "--model", model, "--served-model-name", name,
                "--port", str(port), "--admin-port", str(free_port()), "--limit-bytes", LIMIT,
                "--virtual-bytes", virtual], {}  # fmt: skip

    return make


def _stock_sized(model: str, name: str, port: int) -> tuple[list[str], dict[str, str]]:
    """Stock vLLM with the pool's block size and its KV cache the size of the pool's limit."""
    return [
        *_stock_cmd(model, name, port),
        "--block-size",
        "32",
        "--kv-cache-memory-bytes",
        str(parse_bytes(LIMIT)),
    ], {}


VARIANTS: dict[str, Callable[[str, str, int], tuple[list[str], dict[str, str]]]] = {
    "stock": _stock_sized,
    "connector": _connector,
    "kvpool": _kvpool(VIRTUAL),
    "kvpool-novirt": _kvpool(LIMIT),
}


def launch(variant: str, model: str, name: str, log: Path, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    cmd, extra = VARIANTS[variant](model, name, port)
    proc = start(cmd, port, log, {"VLLM_SERVER_DEV_MODE": "1", **extra, **(env or {})})
    return Server(proc, f"http://127.0.0.1:{port}", log)


def engine_config(url: str) -> dict[str, Any]:
    """The engine's own ``VllmConfig`` as JSON and the ``VLLM_*`` environment it runs with (vLLM's
    dev-mode ``/server_info``)."""
    r = httpx.get(f"{url}/server_info", params={"config_format": "json"}, timeout=30)
    r.raise_for_status()
    return {k: r.json()[k] for k in ("vllm_config", "vllm_env")}


async def drive(url: str, model: str, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """Our own small client (the router benchmark's): all prompts at once, streamed; requests/s,
    tokens/s, TTFT p50/p99."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)

    async def one(p: list[int]) -> tuple[float, int]:
        start = time.perf_counter()
        first, n = None, 0
        stream = await client.completions.create(
            model=model, prompt=[p], max_tokens=max_tokens, stream=True, temperature=0,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices:
                first = first or time.perf_counter()
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
        return (first or time.perf_counter()) - start, n

    start = time.perf_counter()
    try:
        results = await asyncio.gather(*(one(p) for p in prompts))
    finally:
        await client.close()  # before asyncio.run closes the loop (else: "Event loop is closed" noise)
    wall = time.perf_counter() - start
    return {
        "requests_per_s": len(prompts) / wall,
        "tokens_per_s": sum(r[1] for r in results) / wall,
        **ttft_percentiles([r[0] for r in results]),
    }

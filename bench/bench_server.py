"""Our server vs stock vLLM's OpenAI server: same tiny model, same workload, same run.

Each server runs alone (one at a time, alternating A B B A), driven by the same seeded set of
concurrent streaming completions; TTFT = time to the first streamed token. Prints requests/s,
tokens/s and TTFT p50/p99 with kvpool ÷ stock ratios (goal: within 3%); writes
results/bench_server.json. Run: ``python -m bench.bench_server``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import compare, ttft_percentiles


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
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


async def drive(url: str, model: str, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per start")
    p.add_argument("--turns", type=int, default=2, help="times each server is started")
    args = p.parse_args(argv)
    from kvpool.vllm.launch.tiny_model import build_tiny_model

    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    tmp = Path(tempfile.mkdtemp(prefix="kvpool-bench-"))
    common = ["--model", model, "--served-model-name", "tiny", "--max-model-len", "2048"]
    servers = {
        "stock": lambda port: [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *common,
                               "--port", str(port), "--enforce-eager", "--block-size", "32",
                               "--kv-cache-memory-bytes", str(512 << 20)],
        "kvpool": lambda port: [sys.executable, "-m", "kvpool_server", "--model", model, "--served-model-name",
                                "tiny", "--port", str(port), "--limit-bytes", "512Mi", "--virtual-bytes", "2Gi"],
    }  # fmt: skip
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in servers}
    for turn in range(args.turns):
        for name in list(servers) if turn % 2 == 0 else list(servers)[::-1]:
            port = free_port()
            proc = start(servers[name](port), port, tmp / f"{name}-{turn}.log")
            url = f"http://127.0.0.1:{port}"
            try:
                rng = random.Random(0)
                asyncio.run(drive(url, "tiny", [[rng.randrange(10, 2000) for _ in range(64)]] * 8, 8))  # warm-up
                for i in range(args.rounds):
                    rng = random.Random(i + 1)
                    prompts = [[rng.randrange(10, 2000) for _ in range(args.prompt_tokens)]
                               for _ in range(args.requests)]  # fmt: skip
                    rounds[name].append(asyncio.run(drive(url, "tiny", prompts, args.max_tokens)))
            finally:
                proc.terminate()
                proc.wait(timeout=120)
    compare("bench_server", rounds, vars(args))


if __name__ == "__main__":
    main()

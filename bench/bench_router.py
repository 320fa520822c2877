"""The router's cost: the same server reached directly and through kvpool-router, same run.

One tiny-model kvpool-server and one router in front of it stay up; each round drives the same
seeded set of concurrent streaming completions once directly and once through the router, the
order alternating round by round. TTFT = time to the first streamed token at the client. Prints
router ÷ direct per metric (median of the per-round ratios, range, bootstrap 95% interval) and
the TTFT p50 difference in ms (goal: throughput >= 0.98x, TTFT p50 + 1 ms at most); writes
results/bench_router.json. Run: ``python -m bench.bench_router``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import paired_ratios
from bench.servers import drive, free_port, start


def start_router(upstream: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "kvpool_server.router", "--port", str(port), f"--upstream=tiny={upstream}"]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(log.read_text()[-2000:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=64, help="concurrent streams per round")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=6, help="pairs of rounds (direct + router)")
    args = p.parse_args(argv)
    from kvpool.vllm.launch.tiny_model import build_tiny_model

    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    tmp = Path(tempfile.mkdtemp(prefix="kvpool-bench-router-"))
    sport, rport = free_port(), free_port()
    server = start([sys.executable, "-m", "kvpool_server", "--model", model, "--served-model-name", "tiny",
                    "--port", str(sport), "--admin-port", str(free_port()), "--limit-bytes", "512Mi",
                    "--virtual-bytes", "2Gi"], sport,
                   tmp / "server.log")  # fmt: skip
    router = start_router(f"http://127.0.0.1:{sport}", rport, tmp / "router.log")
    urls = {"direct": f"http://127.0.0.1:{sport}", "router": f"http://127.0.0.1:{rport}"}
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in urls}
    try:
        rng = random.Random(0)
        for url in urls.values():  # warm-up both paths
            asyncio.run(drive(url, "tiny", [[rng.randrange(10, 2000) for _ in range(64)]] * 8, 8))
        for i in range(args.rounds):
            for j, name in enumerate(list(urls) if i % 2 == 0 else list(urls)[::-1]):
                # Fresh random prompts for each run: the same prompts twice would let the second run
                # of a pair hit the prefix cache (seen: the second was up to 1.8x faster either way).
                rng = random.Random(1000 * i + j)
                prompts = [[rng.randrange(10, 2000) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
                rounds[name].append(asyncio.run(drive(urls[name], "tiny", prompts, args.max_tokens)))
    finally:
        for proc in (router, server):
            proc.terminate()
            proc.wait(timeout=120)
    paired_ratios("bench_router", rounds, "direct", vars(args))
    extra = [(r["ttft_p50_s"] - d["ttft_p50_s"]) * 1e3 for r, d in zip(rounds["router"], rounds["direct"], strict=True)]
    print(f"router - direct TTFT p50: {statistics.median(extra):+.2f} ms (range {min(extra):+.2f}..{max(extra):+.2f})")


if __name__ == "__main__":
    main()

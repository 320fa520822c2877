"""A bounded soak: two models (the tiny local model, the CPU tier on) behind their own servers,
``--streams`` concurrent streams for ``--minutes``, the two limits swapped every ``--resize-s``
seconds (their sum constant, as the operator moves memory), both pools' integrity checked every
``--check-s`` seconds.

Pass: every request completes with every token it asked for, integrity holds throughout, no block
is in use once the load stops, and the servers' memory (RSS of each server with its engine core)
stays flat once warm. Prints requests, tokens, resizes, latency percentiles and RSS start -> end;
the JSON goes to results/soak.json.

    python -m bench.soak --minutes 10 --streams 256
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.servers import free_port, start
from kvpool.vllm.launch.tiny_model import build_tiny_model

RESULTS = Path("results")
MODELS = ("a", "b")
TOKEN = "soak-admin-token"
LIMITS = (96 << 20, 32 << 20)  # swapped every resize: a cut to a third under load, then back


@dataclass
class Tally:
    requests: int = 0
    tokens: int = 0
    short: list[str] = field(default_factory=list)  # requests that lost tokens or failed
    latencies: list[float] = field(default_factory=list)
    resizes: int = 0
    checks: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    p.add_argument("--streams", type=int, default=256, help="concurrent streams over both models")
    p.add_argument("--resize-s", type=float, default=3.0, help="seconds between limit swaps")
    p.add_argument("--check-s", type=float, default=20.0, help="seconds between integrity checks")
    p.add_argument("--warm-s", type=float, default=60.0, help="RSS is compared from this point on")
    return p.parse_args(argv)


async def stream(client: httpx.AsyncClient, url: str, model: str, rng: random.Random, tally: Tally) -> None:
    want = rng.randint(8, 48)
    prompt = [rng.randrange(10, 1000) for _ in range(rng.randint(16, 400))]
    body = {"model": model, "prompt": [prompt], "max_tokens": want, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0, got = time.monotonic(), None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"usage":{' in line:
                    got = json.loads(line[6:])["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        got = f"{type(e).__name__}: {e}"
    tally.requests += 1
    if got != want:
        tally.short.append(f"{model}: wanted {want}, got {got}")
        return
    tally.tokens += want
    tally.latencies.append(time.monotonic() - t0)


async def load(urls: dict[str, str], streams: int, until: float, tally: Tally) -> None:
    async def worker(i: int) -> None:
        rng, model = random.Random(i), MODELS[i % 2]
        async with httpx.AsyncClient(timeout=600) as client:
            while time.monotonic() < until:
                await stream(client, urls[model], model, rng, tally)

    await asyncio.gather(*(worker(i) for i in range(streams)))


async def control(admin: dict[str, str], args: argparse.Namespace, until: float, tally: Tally,
                  procs: list[Any]) -> None:  # fmt: skip
    revisions = itertools.count(1)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    next_check = time.monotonic()
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        for turn in itertools.count():
            if time.monotonic() >= until:
                return
            rev = next(revisions)
            order = LIMITS if turn % 2 else LIMITS[::-1]
            for (_, url), limit in sorted(zip(admin.items(), order, strict=True), key=lambda x: x[1]):
                r = await client.put(url + "/kvpool/limit", json={"limit_bytes": limit, "revision": rev})
                r.raise_for_status()  # shrink first, then grow: the sum never exceeds the budget
                tally.resizes += 1
            if time.monotonic() >= next_check:
                for url in admin.values():
                    r = await client.get(url + "/kvpool/integrity")
                    assert r.status_code == 200, r.text
                    tally.checks += 1
                tally.rss.append((time.monotonic(), rss(procs)))
                next_check += args.check_s
            await asyncio.sleep(args.resize_s)


def rss(procs: list[Any]) -> int:
    """Resident bytes of every server and its children (engine core, workers)."""
    total = 0
    for p in procs:
        for q in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
            total += q.memory_info().rss
    return total


def report(tally: Tally, args: argparse.Namespace, t0: float, final: dict[str, Any]) -> dict[str, Any]:
    lat = sorted(tally.latencies)
    warm = [r for t, r in tally.rss if t - t0 >= args.warm_s] or [r for _, r in tally.rss]
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [0.0] * 99
    return {
        "minutes": args.minutes, "streams": args.streams, "requests": tally.requests, "tokens": tally.tokens,
        "failed_or_short": len(tally.short), "examples": tally.short[:5], "resizes": tally.resizes,
        "integrity_checks": tally.checks, "latency_p50_s": q[49], "latency_p99_s": q[98],
        "rss_warm_start_mib": warm[0] / 2**20, "rss_end_mib": warm[-1] / 2**20,
        "rss_growth": warm[-1] / warm[0] - 1, "used_blocks_after": {n: s["used_blocks"] for n, s in final.items()},
        "rss_mib_series": [(round(t - t0), round(r / 2**20)) for t, r in tally.rss],
        "rss_growth_last_half": warm[-1] / warm[len(warm) // 2] - 1,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kvpool-soak-"))
    (tmp / "token").write_text(TOKEN)
    model = str(build_tiny_model(tmp / "tiny"))
    ports = {m: (free_port(), free_port()) for m in MODELS}
    procs = [start([sys.executable, "-m", "kvpool_server", "--model", model, "--served-model-name", m, "--port", str(p),
                    "--admin-port", str(a), "--admin-token-file", str(tmp / "token"), "--limit-bytes", "64Mi",
                    "--virtual-bytes", "128Mi", "--offload-bytes", "64Mi", "--offload-dir", str(tmp)],
                   p, tmp / f"{m}.log") for m, (p, a) in ports.items()]  # fmt: skip
    urls = {m: f"http://127.0.0.1:{p}" for m, (p, _) in ports.items()}
    admin = {m: f"http://127.0.0.1:{a}" for m, (_, a) in ports.items()}
    tally = Tally()
    try:
        t0 = time.monotonic()
        until = t0 + args.minutes * 60

        async def run() -> None:
            await asyncio.gather(load(urls, args.streams, until, tally), control(admin, args, until, tally, procs))

        asyncio.run(run())
        headers = {"Authorization": f"Bearer {TOKEN}"}
        final = {m: httpx.get(u + "/kvpool", headers=headers, timeout=30).json() for m, u in admin.items()}
        for u in admin.values():
            assert httpx.get(u + "/kvpool/integrity", headers=headers, timeout=60).status_code == 200
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=120)
    out = report(tally, args, t0, final)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    ok = not tally.short and all(v == 0 for v in out["used_blocks_after"].values())
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
